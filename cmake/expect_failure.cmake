# Runs COMMAND (a ;-list) and passes when it exits non-zero with exactly one line on stderr that
# matches EXPECTED: how the command-line tools must report bad input.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, the command succeeded:\n${out}")
endif()
string(STRIP "${err}" err)
string(FIND "${err}" "\n" newline)
if(NOT newline EQUAL -1)
  message(FATAL_ERROR "expected one line on stderr, got:\n${err}")
endif()
if(NOT err MATCHES "${EXPECTED}")
  message(FATAL_ERROR "stderr does not match '${EXPECTED}':\n${err}")
endif()
