# End-to-end benchmark harness (dsv4 bench): prefill and batched decode of one model on one backend against the
# HBM floor, markdown, JSON and an SVG picture (include from the top-level CMakeLists.txt after dsv4_engine). A library so that
# the CLI and tests/e2e/test_synth.cpp share it; the engine does not depend on it.
add_library(dsv4_bench_e2e STATIC ${CMAKE_CURRENT_LIST_DIR}/bench_e2e.cpp ${CMAKE_CURRENT_LIST_DIR}/bench_plot.cpp)
target_include_directories(dsv4_bench_e2e PUBLIC ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(dsv4_bench_e2e PUBLIC dsv4_engine)
