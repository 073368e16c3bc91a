# Included right before find_package(Torch): points a CUDA LibTorch's own
# CUDA lookup (Caffe2's FindCUDA) at what a pip CUDA torch brings, so that
#   cmake -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# configures without more flags. Does nothing for a CPU LibTorch or when the
# variables are already set.
#
#   CUDA_TOOLKIT_ROOT_DIR  the toolkit whose nvcc CMake's FindCUDAToolkit
#                          reports (it resolves wrapper scripts on PATH,
#                          which FindCUDA does not);
#   CUDA_nvrtc_LIBRARY     NVRTC from the nvidia-cuda-nvrtc wheel
#                          (site-packages/nvidia/cu*/lib or cuda_nvrtc/lib),
#                          which a toolkit without it lacks.

if(NOT CUDA_TOOLKIT_ROOT_DIR)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND CUDAToolkit_BIN_DIR)
    get_filename_component(_toolkit "${CUDAToolkit_BIN_DIR}/.." ABSOLUTE)
    set(CUDA_TOOLKIT_ROOT_DIR "${_toolkit}" CACHE PATH "CUDA toolkit for LibTorch's FindCUDA")
  endif()
endif()

if(NOT CUDA_nvrtc_LIBRARY)
  foreach(_prefix IN LISTS CMAKE_PREFIX_PATH)
    # <site-packages>/torch/share/cmake -> <site-packages>/nvidia
    get_filename_component(_site "${_prefix}/../../.." ABSOLUTE)
    file(GLOB _nvrtc "${_site}/nvidia/cu*/lib/libnvrtc.so.*"
                     "${_site}/nvidia/cuda_nvrtc/lib/libnvrtc.so.*")
    list(FILTER _nvrtc EXCLUDE REGEX "builtins|alt")
    if(_nvrtc)
      list(GET _nvrtc 0 _first)
      # FORCE: FindCUDAToolkit above may have cached it as NOTFOUND.
      set(CUDA_nvrtc_LIBRARY "${_first}" CACHE FILEPATH "NVRTC for a pip CUDA LibTorch" FORCE)
      break()
    endif()
  endforeach()
endif()

# Headers of the CUDA libraries a pip torch's CUDA headers include
# (cusparse.h, cublas_v2.h, ...), from its nvidia-* wheels, for the few
# sources that include ATen's CUDA headers (nccl_group.cc). Empty elsewhere.
set(SPECSTREAM_PIP_CUDA_INCLUDE_DIRS "")
foreach(_prefix IN LISTS CMAKE_PREFIX_PATH)
  get_filename_component(_site "${_prefix}/../../.." ABSOLUTE)
  file(GLOB _includes LIST_DIRECTORIES true "${_site}/nvidia/*/include")
  list(APPEND SPECSTREAM_PIP_CUDA_INCLUDE_DIRS ${_includes})
endforeach()
