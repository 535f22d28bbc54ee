# GEMM benchmark (CUDA builds only): the tensor-core path at V4-Flash prefill shapes. Its cuBLAS / cuBLASLt
# yardstick is bench/gemm/yardstick.py, run with PyTorch on the GPU machine in the same session.
if(DSV4_HAVE_CUDA)
  add_executable(bench_gemm ${CMAKE_CURRENT_LIST_DIR}/bench_gemm.cu)
  target_link_libraries(bench_gemm PRIVATE dsv4_cuda)
endif()
