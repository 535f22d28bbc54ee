# Tokenizer tests (included from tests/CMakeLists.txt). The fixtures are gzip'd JSON lines read with zlib.
dsv4_test(test_tokenizer ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cpp)
target_link_libraries(test_tokenizer PRIVATE dsv4_tokenizer dsv4_tokenizer_zlib)
