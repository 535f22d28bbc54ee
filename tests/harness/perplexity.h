// Running `dsv4 perplexity` (on the CPU backend unless told otherwise) and reading its report (tools/dsv4/cmd_perplexity.cpp,
// tools/dsv4/kl_divergence.h).
#pragma once

#include <string>
#include <vector>

#include "harness/files.h"

namespace dsv4::test {

std::string tiny_model_dir();  // models/tiny: the shipped trained model

// dsv4 perplexity -f text_file --backend cpu --numerics NUMERICS EXTRA...
CliResult perplexity(const std::string& text_file, const std::string& numerics, std::vector<std::string> extra = {});
// The same on a chosen backend.
CliResult perplexity_on(const std::string& backend, const std::string& text_file, const std::string& numerics,
                        std::vector<std::string> extra = {});

// The number after "label ... :" in a report line; throws when the label is missing.
double report_field(const std::string& out, const std::string& label);

// The first line every perplexity run prints, and the perplexity in it.
std::string ppl_line(const std::string& out);
double ppl_of(const std::string& out);

}  // namespace dsv4::test
