// File and process helpers for tests: fixture paths, float32 blobs, temporary directories, running the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::test {

std::string source_path(const std::string& relative);  // inside the repository
std::string ref_small_dir();  // tests/data/reference/ref-small: the reference fixture made by DeepSeek's code

std::vector<float> read_f32(const std::string& path);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void copy_dir(const std::string& from, const std::string& to);

struct CliResult {
  int exit_code = -1;  // −1 when the process was killed by a signal
  int signal = 0;
  std::string out, err;
};
// Runs build/bin/dsv4 with the given arguments (no shell), capturing stdout and stderr; a time limit guards
// against hangs (the process is killed and the result reports the signal).
// stdin_text is the process's standard input (empty: /dev/null).
CliResult run_cli(const std::vector<std::string>& args, int timeout_seconds = 300, const std::string& stdin_text = "");

std::string join_ids(const std::vector<int32_t>& ids, size_t count);

}  // namespace dsv4::test
