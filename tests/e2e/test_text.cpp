// Text in, text out with the shipped tiny model (models/tiny): generate -p streams the text of the ids it
// picks, greedy output is deterministic, perplexity agrees with transformers' figure within 0.5%, and chat
// answers a scripted conversation.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "harness/files.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::test {
namespace {

std::string tiny() { return source_path("models/tiny"); }

TEST(Text, GenerateStreamsTheTextOfTheChosenIds) {
  const CliResult r = run_cli({"generate", "-p", "Once upon a time", "--max-tokens", "24", "--temperature", "0",
                               "--ignore-eos", "--print-ids"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stdout: the prompt and the streamed continuation, a newline, then the ids.
  const size_t last = r.out.rfind('\n', r.out.size() - 2);
  ASSERT_NE(last, std::string::npos) << r.out;
  const std::string text = r.out.substr(0, last);
  std::vector<int32_t> ids;
  std::istringstream in(r.out.substr(last + 1));
  for (int32_t id; in >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 24u);
  const Tokenizer tok = Tokenizer::from_file(tiny());
  EXPECT_EQ(text, "Once upon a time" + tok.decode(ids, /*skip_special=*/true));
  EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
  // Greedy is deterministic.
  const CliResult again = run_cli({"generate", "-p", "Once upon a time", "--max-tokens", "24", "--temperature", "0",
                                   "--ignore-eos", "--print-ids"});
  EXPECT_EQ(again.out, r.out);
}

TEST(Text, PerplexityAgreesWithTransformers) {
  const auto ref = nlohmann::json::parse(read_text(tiny() + "/perplexity.json"));
  const CliResult r = run_cli({"perplexity", "-f", tiny() + "/heldout.txt", "--ctx", std::to_string(ref["chunk"].get<int>() + 1),
                               "--numerics", "exact"},
                              900);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(perplexity ([0-9.]+) over ([0-9]+) tokens)"))) << r.out;
  EXPECT_EQ(std::stoll(m[2]), ref["predicted_tokens"].get<long long>());
  const double ours = std::stod(m[1]), theirs = ref["perplexity"].get<double>();
  EXPECT_LT(std::fabs(ours - theirs) / theirs, 0.005) << "dsv4 " << ours << " vs transformers " << theirs;
}

TEST(Text, ChatAnswersEachLine) {
  const CliResult r = run_cli({"chat", "--max-tokens", "16", "--temperature", "0"}, 300, "Hello!\nTell me a story.\n/quit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '['), 2) << r.err;  // one stats line per answer
}

// models/small writes reasoning in thinking mode (its README): the reasoning, a blank line, the answer, with no think
// marker in either.
TEST(Text, ChatThinkingSeparatesReasoningFromAnswer) {
  const CliResult r = run_cli({"chat", "--model", source_path("models/small"), "--think", "--max-tokens", "64",
                               "--temperature", "0"}, 300, "Who wrote Emma?\n/quit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t gap = r.out.find("\n\n");
  ASSERT_NE(gap, std::string::npos) << r.out;
  const std::string reasoning = r.out.substr(0, gap), answer = r.out.substr(gap + 2);
  EXPECT_FALSE(reasoning.empty()) << r.out;
  EXPECT_FALSE(answer.empty() || answer == "\n") << r.out;
  EXPECT_EQ(r.out.find("think>"), std::string::npos) << r.out;
  EXPECT_NE(answer.find("Austen"), std::string::npos) << r.out;  // what the fine-tune taught it
}

}  // namespace
}  // namespace dsv4::test
