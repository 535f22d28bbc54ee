# MoE benchmark (CUDA builds only): V4-Flash MoE decode against the copy bandwidth (bench_moe.cpp).
if(DSV4_HAVE_CUDA)
  add_executable(bench_moe ${CMAKE_CURRENT_LIST_DIR}/bench_moe.cpp)
  target_link_libraries(bench_moe PRIVATE dsv4_engine)
endif()
