# comm family benchmark (CUDA builds only): bench_all_reduce times the GPU ranks' all-reduce: NCCL per call at
# decode and prefill message sizes, and a decode sub-block boundary with NCCL's against the sum inside
# hc_post_mix over the peer exchange.
if(DSV4_HAVE_CUDA)
  add_executable(bench_all_reduce ${CMAKE_CURRENT_LIST_DIR}/bench_all_reduce.cpp)
  target_link_libraries(bench_all_reduce PRIVATE dsv4_cuda dsv4_bench_common)
endif()
