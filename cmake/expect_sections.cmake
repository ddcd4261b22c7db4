# Runs COMMAND (a ;-list) and requires exit 0 and every line of SECTIONS (a ;-list) in its output,
# in that order: a program's report checked for each of its parts, not one word.
# cmake "-DCOMMAND=prog;args" "-DSECTIONS=first;second" -P expect_sections.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit ${rc}: ${COMMAND}\n${out}\n${err}")
endif()
set(rest "${out}")
foreach(section IN LISTS SECTIONS)
  string(FIND "${rest}" "${section}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the output lacks '${section}' (or has it out of order):\n${out}")
  endif()
  string(SUBSTRING "${rest}" ${at} -1 rest)
endforeach()
