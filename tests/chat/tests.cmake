# Chat format tests (included from tests/CMakeLists.txt): prompt encoding against hand-derived and official
# golden prompts, and the streaming output parser.
dsv4_test(test_chat ${CMAKE_CURRENT_LIST_DIR}/test_chat.cpp)
target_link_libraries(test_chat PRIVATE dsv4_chat)
