# step family benchmark (CUDA builds only): bench_chain times a chain of dependent batch-1 steps (a row read by
# every block, weights streamed, a slice written) as kernels, kernels under PDL and one persistent kernel.
if(DSV4_HAVE_CUDA)
  add_executable(bench_chain ${CMAKE_CURRENT_LIST_DIR}/bench_chain.cu)
  target_link_libraries(bench_chain PRIVATE dsv4_cuda dsv4_bench_common)
endif()
