# LibTorch versions, checked at configure time, and what each needs of the
# build. Included right after find_package(Torch); C++ differences live in
# common/torch/compat.h.
#
# Supported:
#   1.13        Debian 12's libtorch-dev (CPU), the embedded default;
#   2.6 and on  the LibTorch inside a pip or conda torch
#               (-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;
#               print(torch.utils.cmake_prefix_path)')) or the official
#               cxx11-ABI zip. Tested: 2.13 (CPU), 2.14 (CUDA, compile and
#               link), 2.11 (CUDA).
#
# Sets SPECSTREAM_TORCH_VERSION and, for 2.x, CMAKE_CXX_STANDARD 20 (their
# headers need it) and the include shim below.

set(SPECSTREAM_TORCH_VERSION "${Torch_VERSION}")
if(NOT SPECSTREAM_TORCH_VERSION)
  message(FATAL_ERROR "LibTorch found at ${Torch_DIR} reports no version "
    "(TorchConfigVersion.cmake missing); SpecStream needs 1.13 or 2.6 and later")
endif()
if(SPECSTREAM_TORCH_VERSION VERSION_LESS 1.13 OR
   (SPECSTREAM_TORCH_VERSION VERSION_GREATER_EQUAL 1.14 AND
    SPECSTREAM_TORCH_VERSION VERSION_LESS 2.6) OR
   SPECSTREAM_TORCH_VERSION VERSION_GREATER_EQUAL 3)
  message(FATAL_ERROR "LibTorch ${SPECSTREAM_TORCH_VERSION} at ${Torch_DIR} is not "
    "supported: SpecStream builds against 1.13 (Debian 12) or 2.6 and later 2.x. Point "
    "CMAKE_PREFIX_PATH (or Torch_DIR) at another one, e.g. a pip torch's "
    "torch.utils.cmake_prefix_path")
endif()

# Debian's gRPC, Protobuf and Abseil use the cxx11 std::string ABI; a LibTorch
# built for the old one cannot share a std::string with them.
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "LibTorch ${SPECSTREAM_TORCH_VERSION} at ${Torch_DIR} uses the "
    "pre-cxx11 ABI (TORCH_CXX_FLAGS ${TORCH_CXX_FLAGS}); SpecStream links Debian's "
    "gRPC and Abseil, which use the cxx11 ABI. Use the cxx11-ABI LibTorch zip or a "
    "pip torch (2.6 and later are cxx11-ABI)")
endif()

if(SPECSTREAM_TORCH_VERSION VERSION_GREATER_EQUAL 2)
  # 2.x headers are C++20 (their torch target says so, but an imported
  # target's CXX_STANDARD does not reach its users).
  if(NOT CMAKE_CXX_STANDARD OR CMAKE_CXX_STANDARD LESS 20)
    set(CMAKE_CXX_STANDARD 20)
  endif()

  # A pip or zip LibTorch's include/ also carries its own Protobuf and fmt,
  # which would shadow Debian's (that gRPC and spdlog are built against).
  # Its targets see a copy of include/ made of links to everything else.
  set(_root "${TORCH_INSTALL_PREFIX}/include")
  set(_shim "${CMAKE_BINARY_DIR}/torch-include")
  if(EXISTS "${_root}/google" OR EXISTS "${_root}/fmt")
    file(REMOVE_RECURSE "${_shim}")
    file(MAKE_DIRECTORY "${_shim}")
    file(GLOB _entries RELATIVE "${_root}" "${_root}/*")
    foreach(_entry IN LISTS _entries)
      if(NOT _entry MATCHES "^(google|fmt)$")
        file(CREATE_LINK "${_root}/${_entry}" "${_shim}/${_entry}" SYMBOLIC)
      endif()
    endforeach()
    foreach(_target IN ITEMS torch torch_cpu torch_cuda c10 c10_cuda)
      if(TARGET ${_target})
        get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
        if(_dirs)
          list(TRANSFORM _dirs REPLACE "^${_root}" "${_shim}")
          set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
        endif()
      endif()
    endforeach()
    list(TRANSFORM TORCH_INCLUDE_DIRS REPLACE "^${_root}" "${_shim}")
  endif()
endif()
# c10d's ProcessGroupGloo.hpp includes Gloo's headers, which a pip or zip
# LibTorch does not ship: take them from the system (Debian's libgloo-dev,
# or its unpacked package in a prefix on CMAKE_PREFIX_PATH).
if(NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/gloo" AND TARGET torch)
  find_path(SPECSTREAM_GLOO_INCLUDE_DIR gloo/config.h)
  if(NOT SPECSTREAM_GLOO_INCLUDE_DIR)
    message(FATAL_ERROR "LibTorch ${SPECSTREAM_TORCH_VERSION} at ${Torch_DIR} has no Gloo "
      "headers and none were found (install libgloo-dev, or put its unpacked package on "
      "CMAKE_PREFIX_PATH)")
  endif()
  set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
    "${SPECSTREAM_GLOO_INCLUDE_DIR}")
endif()

message(STATUS "SpecStream: LibTorch ${SPECSTREAM_TORCH_VERSION} (${Torch_DIR}), "
  "C++${CMAKE_CXX_STANDARD}")
