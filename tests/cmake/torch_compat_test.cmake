# Checks cmake/TorchCompat.cmake in script mode: which LibTorch versions and
# ABIs it accepts, the error it gives for the others, and the include shim it
# builds for a 2.x LibTorch that bundles Protobuf and fmt headers.
#   cmake -DCOMPAT=<TorchCompat.cmake> -DWORK=<scratch dir> -P torch_compat_test.cmake

set(failures 0)

# expect(<name> <should_pass> <regex the output must match> <-D args...>)
function(expect name should_pass pattern)
  set(dir "${WORK}/${name}")
  file(REMOVE_RECURSE "${dir}")
  file(MAKE_DIRECTORY "${dir}")
  execute_process(COMMAND ${CMAKE_COMMAND} ${ARGN} -P "${COMPAT}"
    WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  if((should_pass AND NOT rc EQUAL 0) OR (NOT should_pass AND rc EQUAL 0))
    message(SEND_ERROR "${name}: exit ${rc}, expected ${should_pass}:\n${all}")
  elseif(NOT all MATCHES "${pattern}")
    message(SEND_ERROR "${name}: output does not match '${pattern}':\n${all}")
  else()
    message(STATUS "${name}: ok")
  endif()
endfunction()

expect(debian_113 TRUE "LibTorch 1\\.13\\.0 .*C\\+\\+17"
  -DTorch_VERSION=1.13.0 -DTorch_DIR=/usr/lib/cmake/Torch -DCMAKE_CXX_STANDARD=17)
expect(too_old FALSE "LibTorch 1\\.12\\.1 at /opt/old is not supported"
  -DTorch_VERSION=1.12.1 -DTorch_DIR=/opt/old)
expect(gap FALSE "LibTorch 2\\.3\\.0 at /opt/t23 is not supported"
  -DTorch_VERSION=2.3.0 -DTorch_DIR=/opt/t23)
expect(future FALSE "LibTorch 3\\.0\\.0 .*not supported" -DTorch_VERSION=3.0.0 -DTorch_DIR=/x)
expect(no_version FALSE "reports no version" -DTorch_DIR=/x)
expect(old_abi FALSE "pre-cxx11 ABI"
  -DTorch_VERSION=2.13.0 -DTorch_DIR=/x "-DTORCH_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=0")

# A pip-like prefix: include/ with torch, c10 and the bundled google, fmt.
set(prefix "${WORK}/pip-torch")
foreach(d torch/csrc/api/include c10 google/protobuf fmt)
  file(MAKE_DIRECTORY "${prefix}/include/${d}")
endforeach()
expect(pip_213 TRUE "LibTorch 2\\.13\\.0 .*C\\+\\+20"
  -DTorch_VERSION=2.13.0 -DTorch_DIR=${prefix}/share/cmake/Torch
  -DTORCH_INSTALL_PREFIX=${prefix} -DCMAKE_CXX_STANDARD=17)
set(shim "${WORK}/pip_213/torch-include")
foreach(kept torch c10)
  if(NOT IS_SYMLINK "${shim}/${kept}")
    message(SEND_ERROR "pip_213: ${shim}/${kept} is not a link into the LibTorch")
  endif()
endforeach()
foreach(hidden google fmt)
  if(EXISTS "${shim}/${hidden}")
    message(SEND_ERROR "pip_213: ${shim}/${hidden} should be hidden")
  endif()
endforeach()
