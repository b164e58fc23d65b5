# Compiles one snippet (syntax only) and checks the outcome: a snippet with an `expect-error: <regex>`
# line must fail to compile with a diagnostic matching <regex> (so it fails for the expected reason, not
# for a typo); any other snippet must compile.
# Variables: COMPILER, SOURCE, INCLUDES (directories joined by '|'), STANDARD (e.g. 20).
foreach(var COMPILER SOURCE INCLUDES STANDARD)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_compile.cmake: ${var} is not set")
  endif()
endforeach()

file(STRINGS "${SOURCE}" expect_line REGEX "^// expect-error: " LIMIT_COUNT 1)
string(REGEX REPLACE "^// expect-error: " "" expected "${expect_line}")

string(REPLACE "|" ";" include_dirs "${INCLUDES}")
set(include_flags "")
foreach(dir IN LISTS include_dirs)
  if(dir)
    list(APPEND include_flags "-I${dir}")
  endif()
endforeach()

execute_process(
  COMMAND "${COMPILER}" -std=c++${STANDARD} -fsyntax-only -Wall -Wextra ${include_flags} "${SOURCE}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(diagnostics "${out}${err}")

if(expected STREQUAL "")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${SOURCE} must compile, but the compiler said:\n${diagnostics}")
  endif()
  message(STATUS "${SOURCE} compiles, as it must")
else()
  if(result EQUAL 0)
    message(FATAL_ERROR "${SOURCE} compiled, but must fail with a diagnostic matching \"${expected}\"")
  endif()
  if(NOT diagnostics MATCHES "${expected}")
    message(FATAL_ERROR "${SOURCE} failed to compile, but not for the expected reason (no diagnostic "
                        "matches \"${expected}\"):\n${diagnostics}")
  endif()
  message(STATUS "${SOURCE} fails to compile, as it must (\"${expected}\")")
endif()
