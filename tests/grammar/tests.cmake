# Constrained decoding (included from tests/CMakeLists.txt): the grammar matcher, schema errors, DSML tool calls
# read back by the chat parser, and the token masks against a brute-force check (tiny and DeepSeek-V4 vocabularies).
dsv4_test(test_grammar ${CMAKE_CURRENT_LIST_DIR}/test_grammar.cpp)
target_link_libraries(test_grammar PRIVATE dsv4_server dsv4_tokenizer_zlib)
