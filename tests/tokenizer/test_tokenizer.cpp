// Tokenizer tests: id parity with Hugging Face `tokenizers` on a >1 MB mixed corpus for DeepSeek-V3 and V4,
// decode parity (U+FFFD repair), tokenizer.json variants that exercise the general machinery, streaming
// decode, special tokens, bad input, and the tokenize / detokenize CLI.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>

#include "fixtures.h"
#include "harness/files.h"
#include "tokenizer/cli.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsv4 {
namespace {

using nlohmann::json;

std::string data_dir() { return test::source_path("tests/data/tokenizer"); }

const std::vector<tokfix::Sample>& samples() {
  static const std::vector<tokfix::Sample> s = tokfix::read_samples(data_dir());
  return s;
}
const Tokenizer& v3() {
  static const Tokenizer t = tokfix::load_v3(data_dir());
  return t;
}
const Tokenizer& v4() {
  static const Tokenizer t = tokfix::load_v4(data_dir());
  return t;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string show(const std::string& text) {
  const std::string s = json(text.substr(0, 120)).dump(-1, ' ', true, json::error_handler_t::replace);
  return text.size() > 120 ? s + "..." : s;
}

// First index where two id sequences differ, for failure messages.
size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

void check_parity(const Tokenizer& tok, const std::string& name) {
  const auto rows = tokfix::read_jsonl_gz(data_dir() + "/ids-" + name + ".jsonl.gz");
  ASSERT_EQ(rows.size(), samples().size()) << "fixture out of date: regenerate with make_parity_fixture.py";
  size_t bytes = 0, tokens = 0, mismatches = 0, roundtrip_failures = 0, plain_checked = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const tokfix::Sample& s = samples()[i];
    const std::vector<int32_t> expected = ids_of(rows[i].at("ids"));
    const std::vector<int32_t> got = tok.encode(s.text);
    bytes += s.text.size();
    tokens += got.size();
    if (got != expected) {
      ++mismatches;
      const size_t d = first_difference(got, expected);
      ADD_FAILURE() << name << " sample " << i << " (" << s.source << ") " << show(s.text) << ": ids differ at "
                    << d << " (got " << (d < got.size() ? got[d] : -1) << ", HF "
                    << (d < expected.size() ? expected[d] : -1) << "; " << got.size() << " vs " << expected.size()
                    << " ids)";
    }
    if (tok.decode(got) != s.text) {
      ++roundtrip_failures;
      ADD_FAILURE() << name << " sample " << i << " (" << s.source << "): decode(encode(x)) != x";
    }
    if (rows[i].contains("plain")) {
      ++plain_checked;
      EXPECT_EQ(tok.encode(s.text, false, /*allow_special=*/false), ids_of(rows[i]["plain"]))
          << name << " sample " << i << " with special tokens as plain text: " << show(s.text);
    }
    if (mismatches + roundtrip_failures > 20) FAIL() << "too many failures, stopping";
  }
  EXPECT_GE(bytes, size_t(1) << 20) << "the parity corpus should hold at least 1 MB";
  EXPECT_GT(plain_checked, 10u);
  std::printf("[ parity ] %s: %zu samples, %zu bytes, %zu ids, %zu mismatches\n", name.c_str(), rows.size(), bytes,
              tokens, mismatches);
}

TEST(TokenizerParity, DeepseekV3MatchesHuggingFace) { check_parity(v3(), "deepseek-v3"); }
TEST(TokenizerParity, DeepseekV4MatchesHuggingFace) { check_parity(v4(), "deepseek-v4"); }

void check_decode(const Tokenizer& tok, const std::string& name) {
  const auto rows = tokfix::read_jsonl_gz(data_dir() + "/decode-" + name + ".jsonl.gz");
  ASSERT_GT(rows.size(), 100u);
  size_t repaired = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<int32_t> ids = ids_of(rows[i].at("ids"));
    const bool skip = rows[i].at("skip_special").get<bool>();
    const std::string expected = rows[i].at("text").get<std::string>();
    EXPECT_EQ(tok.decode(ids, skip), expected) << name << " decode case " << i;
    repaired += expected.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(repaired, rows.size() / 4) << "the decode cases should exercise the U+FFFD repair";
}

TEST(TokenizerParity, DecodeRepairsLikeHuggingFaceV3) { check_decode(v3(), "deepseek-v3"); }
TEST(TokenizerParity, DecodeRepairsLikeHuggingFaceV4) { check_decode(v4(), "deepseek-v4"); }

// Variants of the V3 tokenizer.json: split behaviours, inverted and literal patterns, \w \h \W \S, empty
// matches, GPT-2 ByteLevel regex with prefix space, normalizers, added-token flags, ignore_merges.
TEST(TokenizerParity, VariantsMatchHuggingFace) {
  const json fixture = tokfix::read_jsonl_gz(data_dir() + "/variants.json.gz").at(0);
  const json base = json::parse(tokfix::read_tokenizer_json(data_dir(), "deepseek-v3"));
  const auto indices = fixture.at("sample_indices").get<std::vector<size_t>>();
  for (const json& v : fixture.at("variants")) {
    json j = base;
    if (v.contains("set"))
      for (auto it = v["set"].begin(); it != v["set"].end(); ++it) j[it.key()] = it.value();
    if (v.contains("model"))
      for (auto it = v["model"].begin(); it != v["model"].end(); ++it) j["model"][it.key()] = it.value();
    if (v.contains("add_tokens"))
      for (const json& t : v["add_tokens"]) j["added_tokens"].push_back(t);
    const std::string name = v.at("name").get<std::string>();
    const Tokenizer tok = Tokenizer::from_json(j.dump(), name);
    const auto& expected = v.at("ids");
    ASSERT_EQ(expected.size(), indices.size());
    size_t failures = 0;
    for (size_t k = 0; k < indices.size() && failures < 10; ++k) {
      const tokfix::Sample& s = samples().at(indices[k]);
      const std::vector<int32_t> want = ids_of(expected[k]);
      const std::vector<int32_t> got = tok.encode(s.text);
      if (got != want) {
        ++failures;
        const size_t d = first_difference(got, want);
        ADD_FAILURE() << "variant " << name << ", sample " << indices[k] << " (" << s.source << ") "
                      << show(s.text) << ": ids differ at " << d;
      }
    }
  }
}

// Single-character classes, code point by code point against Oniguruma inside `tokenizers`: checks the
// translation of \s \w \h, POSIX classes and the categories of the DeepSeek patterns. Code points that
// PCRE2's Unicode 14 tables leave unassigned are skipped (newer Unicode is a known gap, see the design note).
TEST(TokenizerParity, CharacterClassesMatchOniguruma) {
  const json fixture = tokfix::read_jsonl_gz(data_dir() + "/charclasses.json.gz").at(0);
  const uint32_t limit = fixture.at("limit").get<uint32_t>();
  const tok::Regex unassigned(R"(\A\p{Cn}\z)", tok::Regex::Syntax::kPcre2, "Cn");
  std::vector<std::string> chars(limit);
  std::vector<uint8_t> assigned(limit, 0);
  size_t b = 0, e = 0;
  for (uint32_t cp = 0; cp < limit; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    tok::append_utf8(chars[cp], cp);
    assigned[cp] = !unassigned.search(chars[cp], 0, b, e);
  }
  size_t compared = 0;
  for (auto it = fixture.at("classes").begin(); it != fixture.at("classes").end(); ++it) {
    const tok::Regex regex("\\A(?:" + it.key() + ")\\z", tok::Regex::Syntax::kOniguruma, it.key());
    std::vector<uint8_t> expected(limit, 0);
    for (const json& range : it.value())
      for (uint32_t cp = range[0].get<uint32_t>(); cp <= range[1].get<uint32_t>(); ++cp) expected[cp] = 1;
    size_t mismatches = 0;
    for (uint32_t cp = 0; cp < limit; ++cp) {
      if (!assigned[cp]) continue;
      ++compared;
      const bool got = regex.search(chars[cp], 0, b, e);
      if (got != bool(expected[cp]) && ++mismatches <= 5)
        ADD_FAILURE() << it.key() << ": U+" << std::hex << cp << std::dec << " is " << (got ? "" : "not ")
                      << "matched here but " << (expected[cp] ? "is" : "is not") << " in Oniguruma";
    }
  }
  EXPECT_GT(compared, fixture.at("classes").size() * 140000u);  // ~150k assigned code points per class
}

// ---------------------------------------------------------------------------------------------------------
// Special tokens

TEST(Tokenizer, SpecialTokensInsideTextBecomeTheirIds) {
  const Tokenizer& t = v4();
  const int32_t bos = *t.token_to_id("<｜begin▁of▁sentence｜>"), user = *t.token_to_id("<｜User｜>");
  const int32_t assistant = *t.token_to_id("<｜Assistant｜>"), think = *t.token_to_id("<think>");
  const int32_t end_think = *t.token_to_id("</think>");
  EXPECT_EQ(bos, 0);
  EXPECT_EQ(user, 128803);
  EXPECT_TRUE(t.is_special(bos));
  // NOTE: in the DeepSeek files the chat markers (<｜User｜>, <｜Assistant｜>, <think>, ...) are added tokens
  // that are *not* marked special; only BOS / EOS / padding and the placeholders are.
  EXPECT_FALSE(t.is_special(user));
  EXPECT_FALSE(t.is_special(think));
  const std::vector<int32_t> ids = t.encode("<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜><think>x</think>");
  ASSERT_GE(ids.size(), 7u);
  EXPECT_EQ(ids[0], bos);
  EXPECT_EQ(ids[1], user);
  EXPECT_EQ(ids.back(), end_think);
  EXPECT_NE(std::find(ids.begin(), ids.end(), assistant), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), think), ids.end());

  // allow_special = false: special tokens become ordinary text, non-special added tokens still match (as
  // with encode_special_tokens = True in `tokenizers`).
  const std::vector<int32_t> plain = t.encode("<｜begin▁of▁sentence｜><think>", false, false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), bos), plain.end());
  EXPECT_GT(plain.size(), 2u);
  EXPECT_EQ(plain.back(), think);
  EXPECT_EQ(t.decode(plain), "<｜begin▁of▁sentence｜><think>");

  // Partial token strings stay text.
  for (const int32_t id : t.encode("<｜User <think <｜begin▁of▁sentence"))
    EXPECT_TRUE(id != user && id != think && id != bos) << id;
}

TEST(Tokenizer, BosEosAndVocabulary) {
  EXPECT_EQ(v4().bos_id(), 0);
  EXPECT_EQ(v4().eos_id(), 1);
  EXPECT_EQ(v4().vocab_size(), 129280);  // = the DeepSeek-V4 embedding rows
  EXPECT_EQ(v3().bos_id(), 0);           // from tokenizer_config.json beside the file
  EXPECT_EQ(v3().eos_id(), 1);
  const std::vector<int32_t> ids = v4().encode("Hi", /*add_bos=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(v4().encode("Hi").front(), ids[1]);
  EXPECT_EQ(v4().decode(ids), "<｜begin▁of▁sentence｜>Hi");
  EXPECT_EQ(v4().decode(ids, /*skip_special=*/true), "Hi");
  EXPECT_EQ(v4().id_to_token(*v4().token_to_id("Ġthe")), "Ġthe");
  EXPECT_EQ(v4().token_to_id("no such token at all"), std::nullopt);
  EXPECT_EQ(v4().id_to_token(-5), std::nullopt);
  EXPECT_TRUE(v4().encode("").empty());
  EXPECT_EQ(v4().decode(std::vector<int32_t>{-1, 999999}), "");  // ids without a token are skipped
}

// ---------------------------------------------------------------------------------------------------------
// Streaming decode

bool valid_utf8(const std::string& s) { return tok::find_invalid_utf8(s) == std::string::npos; }

TEST(StreamDecoder, HoldsBackAMultiByteCharacterSplitAcrossTokens) {
  const Tokenizer& t = v4();
  const tok::ByteAlphabet& alphabet = tok::byte_alphabet();
  const auto byte_token = [&](uint8_t b) { return *t.token_to_id(alphabet.utf8(b)); };
  // "€" = E2 82 AC, then "😀" = F0 9F 98 80, each byte its own token.
  StreamDecoder stream(t);
  EXPECT_EQ(stream.push(*t.token_to_id("a")), "a");
  EXPECT_EQ(stream.push(byte_token(0xE2)), "");
  EXPECT_EQ(stream.push(byte_token(0x82)), "");
  EXPECT_EQ(stream.pending_bytes(), 2u);
  EXPECT_EQ(stream.push(byte_token(0xAC)), "€");
  EXPECT_EQ(stream.push(byte_token(0xF0)), "");
  EXPECT_EQ(stream.push(byte_token(0x9F)), "");
  EXPECT_EQ(stream.push(byte_token(0x98)), "");
  EXPECT_EQ(stream.push(byte_token(0x80)), "😀");
  EXPECT_EQ(stream.pending_bytes(), 0u);

  // A sequence that turns out invalid is replaced exactly where decode() replaces it.
  EXPECT_EQ(stream.push(byte_token(0xE2)), "");
  EXPECT_EQ(stream.push(*t.token_to_id("b")), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(stream.push(byte_token(0xFF)), "\xEF\xBF\xBD");  // can never start a character: not held
  // An incomplete tail at the end of the stream becomes U+FFFD on finish().
  EXPECT_EQ(stream.push(byte_token(0xF0)), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST(StreamDecoder, ChunksAreValidUtf8AndConcatenateToDecode) {
  const Tokenizer& t = v4();
  size_t held_back = 0;
  for (const tokfix::Sample& s : samples()) {
    const std::vector<int32_t> ids = t.encode(s.text);
    StreamDecoder stream(t);
    std::string text;
    for (const int32_t id : ids) {
      const std::string chunk = stream.push(id);
      ASSERT_TRUE(valid_utf8(chunk)) << s.source;
      held_back += stream.pending_bytes() > 0;
      text += chunk;
    }
    text += stream.finish();
    ASSERT_EQ(text, s.text) << s.source;
  }
  EXPECT_GT(held_back, 1000u) << "the corpus should split characters across tokens";

  // Random ids, including partial byte tokens and special ones: same property against decode().
  std::mt19937 rng(7);
  for (int c = 0; c < 500; ++c) {
    std::vector<int32_t> ids(1 + rng() % 30);
    for (int32_t& id : ids) id = int32_t(rng() % uint32_t(t.vocab_size()));
    const bool skip = c % 3 == 0;
    StreamDecoder stream(t, skip);
    std::string text;
    for (const int32_t id : ids) {
      const std::string chunk = stream.push(id);
      ASSERT_TRUE(valid_utf8(chunk));
      text += chunk;
    }
    text += stream.finish();
    EXPECT_EQ(text, t.decode(ids, skip)) << "case " << c;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Bad input

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string tiny_json() {
  return R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 4, "Ġab": 5},
              "merges": ["a b", ["Ġ", "ab"]]}})";
}

TEST(TokenizerErrors, BadInputNamesTheFileAndField) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  const auto load_text = [&](const std::string& text) {
    test::write_text(path, text);
    return error_of([&] { Tokenizer::from_file(path); });
  };
  EXPECT_NE(error_of([&] { Tokenizer::from_file(dir.file("missing.json")); }).find("missing.json"), std::string::npos);
  std::string e = load_text("{\"model\": ");
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;

  json j = json::parse(tiny_json());
  EXPECT_EQ(load_text(j.dump()), "(no error)");
  EXPECT_EQ(Tokenizer::from_file(dir.path()).encode("ab"), (std::vector<int32_t>{2}));  // DIR/tokenizer.json

  json bad = j;
  bad["model"]["type"] = "WordPiece";
  e = load_text(bad.dump());
  EXPECT_NE(e.find("model.type"), std::string::npos) << e;
  EXPECT_NE(e.find("WordPiece"), std::string::npos) << e;

  bad = j;
  bad["pre_tokenizer"] = {{"type", "Whitespace"}};
  e = load_text(bad.dump());
  EXPECT_NE(e.find("pre_tokenizer"), std::string::npos) << e;
  EXPECT_NE(e.find("Whitespace"), std::string::npos) << e;

  bad = j;
  bad["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  e = load_text(bad.dump());
  EXPECT_NE(e.find("pre_tokenizer.pattern"), std::string::npos) << e;

  bad = j;
  bad["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(load_text(bad.dump()).find("Sideways"), std::string::npos);

  bad = j;
  bad["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(load_text(bad.dump()).find("normalizer: unsupported normalizer type 'NFKC'"), std::string::npos);

  bad = j;
  bad["model"]["merges"].push_back("a zz");
  e = load_text(bad.dump());
  EXPECT_NE(e.find("model.merges[2]"), std::string::npos) << e;

  bad = j;
  bad["model"].erase("vocab");
  EXPECT_NE(load_text(bad.dump()).find("missing field 'vocab'"), std::string::npos);

  bad = j;
  bad["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_text(bad.dump()).find("decoder"), std::string::npos);

  bad = j;
  bad["added_tokens"][0]["id"] = -2;
  EXPECT_NE(load_text(bad.dump()).find("added_tokens[0].id"), std::string::npos);

  // A tokenizer_config.json naming a BOS that does not exist.
  test::write_text(path, j.dump());
  test::write_text(dir.file("tokenizer_config.json"), R"({"bos_token": "<nope>"})");
  e = error_of([&] { Tokenizer::from_file(path); });
  EXPECT_NE(e.find("bos_token '<nope>'"), std::string::npos) << e;

  // Text that is not UTF-8.
  e = error_of([&] { v4().encode("ok \xC3\x28 bad"); });
  EXPECT_NE(e.find("not valid UTF-8 (byte offset 3)"), std::string::npos) << e;
  // add_bos with no BOS token.
  const Tokenizer tiny = Tokenizer::from_json(tiny_json());
  EXPECT_EQ(tiny.bos_id(), std::nullopt);
  EXPECT_NE(error_of([&] { tiny.encode("ab", true); }).find("no BOS"), std::string::npos);
  EXPECT_EQ(tiny.encode("ab ab<s>"), (std::vector<int32_t>{2, 5, 3}));
}

// Mutated tokenizer.json documents: each either loads or fails with dsv4::Error, never anything else.
TEST(TokenizerErrors, FuzzedTokenizerJson) {
  const std::string good = tiny_json();
  std::mt19937 rng(1234);
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = good;
    const int edits = 1 + int(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = rng() % text.size();
      switch (rng() % 4) {
        case 0: text[pos] = char(rng() % 128); break;
        case 1: text.erase(pos, 1 + rng() % 8); break;
        case 2: text.insert(text.begin() + std::ptrdiff_t(pos), "{}[]\",:0a\\"[rng() % 10]); break;
        default: text.resize(pos); break;
      }
      if (text.empty()) text.push_back('{');
    }
    try {
      const Tokenizer t = Tokenizer::from_json(text, "fuzz");
      t.decode(t.encode("ab ab <s> b a"));
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, 0);
}

// Random Unicode text: encoding never fails and always round-trips.
TEST(Tokenizer, RandomTextRoundTrips) {
  std::mt19937 rng(99);
  const uint32_t ranges[][2] = {{0x20, 0x7F}, {0x0, 0x20}, {0xA0, 0x800}, {0x3000, 0x9FFF}, {0xAC00, 0xD7A3},
                                {0x1F300, 0x1FAFF}, {0x10000, 0x10FFFF}, {0x300, 0x370}, {0xE000, 0xFFFF}};
  for (int c = 0; c < 300; ++c) {
    std::string text;
    const int n = int(rng() % 200);
    for (int k = 0; k < n; ++k) {
      const auto& r = ranges[rng() % std::size(ranges)];
      uint32_t cp = r[0] + rng() % (r[1] - r[0]);
      if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
      tok::append_utf8(text, cp);
    }
    EXPECT_EQ(v4().decode(v4().encode(text)), text) << "case " << c;
  }
}

// ---------------------------------------------------------------------------------------------------------
// CLI

TEST(TokenizerCli, TokenizeAndDetokenizeJsonLines) {
  const Tokenizer& t = v4();
  std::istringstream in("\"Hello, world!\"\n\"<｜User｜>你好\"\n\"\"\n");
  std::ostringstream out;
  cli::tokenize_jsonl(t, in, out, /*add_bos=*/false, /*allow_special=*/true);
  std::istringstream lines(out.str());
  std::string line;
  std::vector<std::vector<int32_t>> ids;
  while (std::getline(lines, line)) ids.push_back(json::parse(line).get<std::vector<int32_t>>());
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], t.encode("Hello, world!"));
  EXPECT_EQ(ids[1], t.encode("<｜User｜>你好"));
  EXPECT_TRUE(ids[2].empty());

  std::istringstream in_bos("\"x\"\n");
  std::ostringstream out_bos;
  cli::tokenize_jsonl(t, in_bos, out_bos, true, true);
  EXPECT_EQ(json::parse(out_bos.str())[0], 0);

  std::istringstream in2(out.str());
  std::ostringstream text;
  cli::detokenize_jsonl(t, in2, text, false);
  EXPECT_EQ(text.str(), "\"Hello, world!\"\n\"<｜User｜>你好\"\n\"\"\n");

  std::istringstream bad("\"ok\"\n\"fine\"\n[1, 2]\n");
  std::ostringstream sink;
  const std::string e = error_of([&] { cli::tokenize_jsonl(t, bad, sink, false, true); });
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  const std::string written = sink.str();
  EXPECT_EQ(std::count(written.begin(), written.end(), '\n'), 2);

  std::istringstream bad_ids("[1, 2]\n[3, -4]\n");
  EXPECT_NE(error_of([&] { cli::detokenize_jsonl(t, bad_ids, sink, false); }).find("line 2"), std::string::npos);
  std::istringstream not_json("[1, 2\n");
  EXPECT_NE(error_of([&] { cli::detokenize_jsonl(t, not_json, sink, false); }).find("line 1: invalid JSON"),
            std::string::npos);
}

// The dsv4 binary end to end: `dsv4 tokenize` / `dsv4 detokenize` through a shell pipe.
TEST(TokenizerCli, Binary) {
  test::TempDir dir;
  const std::string tokenizer = dir.file("tokenizer.json");  // the CLI reads plain JSON
  test::write_text(tokenizer, tokfix::read_tokenizer_json(data_dir(), "deepseek-v3"));
  test::write_text(dir.file("in.jsonl"), "\"Hello 世界 👋🏽\"\n\"<｜begin▁of▁sentence｜>x\"\n");
  const auto run = [&](const std::string& args, const std::string& in, const std::string& out) {
    const std::string command = std::string(DSV4_CLI) + " " + args + " < " + dir.file(in) + " > " + dir.file(out) +
                                " 2> " + dir.file("err.txt");
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_EQ(run("tokenize --tokenizer " + tokenizer + " --jsonl", "in.jsonl", "ids.jsonl"), 0)
      << test::read_text(dir.file("err.txt"));
  const std::string ids = test::read_text(dir.file("ids.jsonl"));
  EXPECT_EQ(ids.substr(0, ids.find('\n')), json(v3().encode("Hello 世界 👋🏽")).dump());
  ASSERT_EQ(run("detokenize --tokenizer " + tokenizer + " --jsonl", "ids.jsonl", "text.jsonl"), 0)
      << test::read_text(dir.file("err.txt"));
  EXPECT_EQ(test::read_text(dir.file("text.jsonl")), test::read_text(dir.file("in.jsonl")));

  test::write_text(dir.file("bad.jsonl"), "\"fine\"\nnot json\n");
  EXPECT_EQ(run("tokenize --tokenizer " + tokenizer + " --jsonl", "bad.jsonl", "out.jsonl"), 1);
  EXPECT_NE(test::read_text(dir.file("err.txt")).find("line 2"), std::string::npos);
  EXPECT_EQ(run("tokenize --tokenizer " + dir.file("nope.json") + " --jsonl", "in.jsonl", "out.jsonl"), 1);
  EXPECT_NE(test::read_text(dir.file("err.txt")).find("nope.json"), std::string::npos);
}

}  // namespace
}  // namespace dsv4
