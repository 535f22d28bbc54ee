# Server tests (included from tests/CMakeLists.txt).
# test_server: the scheduler, output decoder, request parsing and metrics, in C++.
dsv4_test(test_server ${CMAKE_CURRENT_LIST_DIR}/test_server.cpp)
target_link_libraries(test_server PRIVATE dsv4_server)

# test_openai.py: the running `dsv4 serve` driven by the official openai Python client. tools/setup installs
# the client into a virtual environment under build/ (Debian's Python is externally managed, and a venv keeps
# the pinned versions away from the system). One CTest entry per test class, so they run in parallel.
set(DSV4_PYTHON "${PROJECT_SOURCE_DIR}/build/venv/bin/python" CACHE FILEPATH
    "Python with the openai package, for the server tests (tools/setup makes build/venv)")
if(EXISTS "${DSV4_PYTHON}")
  foreach(class TestApi TestConcurrency TestRobustness TestAccess TestSlowClients TestOverload)
    add_test(NAME server_openai.${class}
             COMMAND "${DSV4_PYTHON}" -m unittest -v test_openai.${class}
             WORKING_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}")
    set_tests_properties(server_openai.${class} PROPERTIES
                         ENVIRONMENT "DSV4_CLI=$<TARGET_FILE:dsv4>;PYTHONDONTWRITEBYTECODE=1" TIMEOUT 1200)
  endforeach()
else()
  message(WARNING "dsv4: ${DSV4_PYTHON} not found, the openai client tests of the server are not registered "
                  "(run tools/setup)")
endif()
