# gemm family benchmarks (CUDA builds only): bench_gemv times the decode GEMV at V4-Flash shapes against the
# measured copy bandwidth; bench_gemm times the tensor-core path at V4-Flash prefill shapes, its cuBLAS /
# cuBLASLt yardstick is bench/gemm/yardstick.py, run with PyTorch on the GPU machine in the same session.
if(DSV4_HAVE_CUDA)
  add_executable(bench_gemv ${CMAKE_CURRENT_LIST_DIR}/bench_gemv.cpp)
  target_link_libraries(bench_gemv PRIVATE dsv4_cuda dsv4_bench_common)
  add_executable(bench_gemm ${CMAKE_CURRENT_LIST_DIR}/bench_gemm.cu)
  target_link_libraries(bench_gemm PRIVATE dsv4_cuda dsv4_bench_common)
endif()
