# doc_code_block.cmake: keeps a source file and its copy in a Markdown page identical. The page
# marks the copy with a line `<!-- include: PATH -->` directly above a fenced code block; the
# block's text must equal the file's. Run with cmake -P:
#   cmake -DDOC=docs/walkthrough.md -DSOURCE=examples/walkthrough_2d.c -DMARK=PATH -P this-file
# checks (fails naming both files when they differ), and with -DUPDATE=ON rewrites the block
# from the file. MARK is the PATH the page names (default: SOURCE as given).
cmake_minimum_required(VERSION 3.20)
foreach(var DOC SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "doc_code_block.cmake: pass -D${var}=...")
  endif()
endforeach()
if(NOT DEFINED MARK)
  set(MARK "${SOURCE}")
endif()

file(READ "${DOC}" doc)
file(READ "${SOURCE}" src)

set(marker "<!-- include: ${MARK} -->\n")
string(FIND "${doc}" "${marker}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${DOC} has no line `<!-- include: ${MARK} -->` above a code block")
endif()
string(LENGTH "${marker}" marker_len)
math(EXPR after "${at} + ${marker_len}")
string(SUBSTRING "${doc}" ${after} -1 rest)
# The opening fence: ``` and an optional language, on the line right after the marker.
string(REGEX MATCH "^```[a-z]*\n" fence "${rest}")
if(NOT fence)
  message(FATAL_ERROR "${DOC}: the line after `<!-- include: ${MARK} -->` must open a code "
                      "block (```c)")
endif()
string(LENGTH "${fence}" fence_len)
string(SUBSTRING "${rest}" ${fence_len} -1 body)
# The block's text ends with the newline before the closing fence (an empty block has none).
string(REGEX MATCH "^```" empty "${body}")
if(empty)
  set(block_len 0)
else()
  string(FIND "${body}" "\n```" close)
  if(close EQUAL -1)
    message(FATAL_ERROR "${DOC}: the code block of ${MARK} is not closed")
  endif()
  math(EXPR block_len "${close} + 1")
endif()
string(SUBSTRING "${body}" 0 ${block_len} block)

if(block STREQUAL src)
  return()
endif()
if(UPDATE)
  math(EXPR head_len "${after} + ${fence_len}")
  string(SUBSTRING "${doc}" 0 ${head_len} head)
  string(SUBSTRING "${body}" ${block_len} -1 tail)
  file(WRITE "${DOC}" "${head}${src}${tail}")
  message(STATUS "${DOC}: the code block of ${MARK} now equals ${SOURCE}")
  return()
endif()
set(mark_arg "")
if(NOT MARK STREQUAL SOURCE)
  set(mark_arg " -DMARK=${MARK}")
endif()
message(FATAL_ERROR "${DOC}: the code block of ${MARK} differs from ${SOURCE}. Copy the file "
                    "into the page with\n  cmake -DDOC=${DOC} -DSOURCE=${SOURCE}${mark_arg} "
                    "-DUPDATE=ON -P cmake/doc_code_block.cmake")
