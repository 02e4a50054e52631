# private_headers.cmake: the public include prefix `fsdp/` holds the public headers only. Run from
# the source root with cmake -P; fails naming the file when
#  - a folder named `fsdp` sits under an include root of the build (src/, tests/, tools/): its
#    headers would be reachable as `fsdp/...` beside the public ones;
#  - a source includes "fsdp/NAME.h" where NAME is no public header (include/fsdp/NAME.h, or
#    the generated version.h from include/fsdp/version.h.in).
cmake_minimum_required(VERSION 3.20)
set(failures "")
foreach(root src tests tools)
  file(GLOB_RECURSE dirs LIST_DIRECTORIES true "${root}/*")
  foreach(d ${dirs})
    get_filename_component(name "${d}" NAME)
    if(IS_DIRECTORY "${d}" AND name STREQUAL "fsdp")
      string(APPEND failures "  ${d}: a folder named fsdp under the include root ${root}/; its "
                             "headers are reachable as fsdp/..., the public prefix: rename it\n")
    endif()
  endforeach()
endforeach()
file(GLOB_RECURSE sources src/*.c src/*.h src/*.cu src/*.cuh tests/*.c tests/*.h tools/*.c
     tools/*.h bench/*.c bench/*.h examples/*.c plugin/*.c .ci/*.c)
foreach(f ${sources})
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]fsdp/")
  foreach(line ${lines})
    string(REGEX MATCH "fsdp/[^\">]+" inc "${line}")
    if(NOT EXISTS "include/${inc}" AND NOT EXISTS "include/${inc}.in")
      string(APPEND failures "  ${f}: includes ${inc}, which is no public header "
                             "(include/fsdp/); include the private header by its own folder\n")
    endif()
  endforeach()
endforeach()
if(failures)
  message(FATAL_ERROR "private headers under the public prefix fsdp/:\n${failures}")
endif()
list(LENGTH sources n)
message(STATUS "private_headers: ${n} sources include only public headers as fsdp/...")
