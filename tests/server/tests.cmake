# Server tests (included from tests/CMakeLists.txt).
# test_server: the scheduler, output decoder, request parsing and metrics, in C++; test_dashboard: the dashboard's
# timeline.
dsv4_test(test_server ${CMAKE_CURRENT_LIST_DIR}/test_server.cpp)
target_link_libraries(test_server PRIVATE dsv4_server)
dsv4_test(test_dashboard ${CMAKE_CURRENT_LIST_DIR}/test_dashboard.cpp)
target_link_libraries(test_dashboard PRIVATE dsv4_server)

# test_openai.py, test_anthropic.py, test_structured.py (constrained decoding) and test_tool_model.py (tool calls
# that models/small writes itself): the running `dsv4 serve` driven by the official openai and anthropic Python
# clients; test_fuzz.py: random and structured bytes at its listener.
# tools/setup installs the clients into a virtual environment under build/ (Debian's Python is externally managed,
# and a venv keeps the pinned versions away from the system). One CTest entry per test class, so they run in
# parallel. test_dashboard.py loads the dashboard in headless Chromium and leaves its screenshot in build/artifacts/.
set(DSV4_PYTHON "${PROJECT_SOURCE_DIR}/build/venv/bin/python" CACHE FILEPATH
    "Python with the openai and anthropic packages, for the server tests (tools/setup makes build/venv)")
if(EXISTS "${DSV4_PYTHON}")
  set(environment "DSV4_CLI=$<TARGET_FILE:dsv4>" "DSV4_ARTIFACTS=${CMAKE_BINARY_DIR}/artifacts"
                  PYTHONDONTWRITEBYTECODE=1)
  foreach(test openai.TestApi openai.TestConcurrency openai.TestRobustness openai.TestAccess openai.TestSlowClients
               openai.TestOverload anthropic.TestMessages anthropic.TestMessagesAccess dashboard.TestDashboard
               structured.TestStructuredOutput tool_model.TestOpenAI tool_model.TestAnthropic fuzz.TestHttpFuzz)
    add_test(NAME server_${test}
             COMMAND "${DSV4_PYTHON}" -m unittest -v test_${test}
             WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}")
    set_tests_properties(server_${test} PROPERTIES ENVIRONMENT "${environment}" TIMEOUT 1200)
  endforeach()
  # The listener fuzz (100,000 requests; DSV4_FUZZ_REQUESTS in the environment changes the count): `ctest -L fuzz`
  # runs it alone, `ctest -LE fuzz` the others.
  set_tests_properties(server_fuzz.TestHttpFuzz PROPERTIES LABELS fuzz)
else()
  message(WARNING "dsv4: ${DSV4_PYTHON} not found, the client tests of the server are not registered "
                  "(run tools/setup)")
endif()
