// Minimal command-line parsing for the dsv4 subcommands: --flag VALUE and boolean --switch.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace dsv4::cli {

bool wants_help(int argc, char** argv);  // any argument after the command is --help / -h

class Args {
 public:
  // `valued` and `switches` list the accepted options; anything else is an error naming the option.
  Args(int argc, char** argv, int first, const std::set<std::string>& valued, const std::set<std::string>& switches);
  // Option sets are often assembled from shared groups.
  static std::set<std::string> options(std::initializer_list<std::set<std::string>> groups);

  bool has(const std::string& name) const { return values_.count(name) || flags_.count(name); }
  std::string get(const std::string& name) const;  // required
  std::string get(const std::string& name, const std::string& fallback) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  std::vector<int32_t> get_ids(const std::string& name) const;  // "1,2,3"

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

}  // namespace dsv4::cli
