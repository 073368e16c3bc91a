# Registers a gtest executable's tests with ctest one suite at a time
# (tests/CMakeLists.txt, specstream_add_test): run after the executable is
# linked, it lists the executable's tests and writes OUT, a ctest script with
# one test per suite, named after the suite, that runs
# `EXE --gtest_filter=<suite>.*`, and sets `suite_tests` to their names. The
# properties (labels, environment, COST...) are not baked in: the include
# file the configure step writes applies them, so a change to them needs no
# relink.
#
# One process per suite, not per TEST: a LibTorch executable spends about
# 0.5 s of CPU in LibTorch's static initialisation before its first test
# (measured: trainer_test --gtest_filter=NONE, 0.44 s user + 0.16 s sys),
# and 363 of the cases sat in 35 such executables.
#
#   cmake -D EXE=<path> -D OUT=<file> -P suite_tests.cmake
foreach(var EXE OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "suite_tests.cmake: -D ${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND "${EXE}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "suite_tests.cmake: ${EXE} --gtest_list_tests failed (${rc}): ${errors}")
endif()

# gtest lists "Suite." (or "Prefix/Suite/0.  # TypeParam = ...") at column 0
# and the cases indented under it.
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.")
    list(APPEND suites "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(REMOVE_DUPLICATES suites)
if(suites STREQUAL "")
  message(FATAL_ERROR "suite_tests.cmake: ${EXE} lists no tests")
endif()

set(script "# Written by tests/cmake/suite_tests.cmake from ${EXE}.\n")
set(names "")
foreach(suite IN LISTS suites)
  # ctest names cannot hold '/': a parameterised suite's prefix and index
  # become '.'.
  string(REPLACE "/" "." test "${suite}")
  string(APPEND script "add_test([=[${test}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=])\n")
  list(APPEND names "${test}")
endforeach()
string(APPEND script "set(suite_tests [=[${names}]=])\n")
file(WRITE "${OUT}" "${script}")
