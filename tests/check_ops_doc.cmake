# docs/ops.md lists every op: each function declared at the start of a line (Tensor name(, TopK
# name(, AttentionBlock name(, int name() in the per-shard op headers must appear there as `name` or
# `name(...`.
# cmake -DSOURCE_DIR=<repo> -P check_ops_doc.cmake
file(READ ${SOURCE_DIR}/docs/ops.md doc)
set(missing "")
foreach(header ops.h index_ops.h transformer_ops.h collectives.h)
  file(STRINGS ${SOURCE_DIR}/include/nax/ops/${header} lines REGEX "^(Tensor|TopK|AttentionBlock|int) +[a-z_0-9]+\\(")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^(Tensor|TopK|AttentionBlock|int) +([a-z_0-9]+)\\(.*" "\\2" name "${line}")
    string(REGEX MATCH "`${name}[`(]" found "${doc}")
    if(NOT found)
      list(APPEND missing "${name} (${header})")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES missing)
if(missing)
  message(FATAL_ERROR "docs/ops.md does not list: ${missing}")
endif()
message(STATUS "docs/ops.md lists every op")
