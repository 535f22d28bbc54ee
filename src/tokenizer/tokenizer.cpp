// Tokenizer facade: loads tokenizer.json into its stages and runs them (added tokens -> normalizer ->
// pre-tokenizer -> BPE) to encode, and the ByteLevel decoder to decode.
#include "tokenizer/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace dsv4 {

using tok::Json;

namespace {

constexpr const char* kDeepseekBos = "<｜begin▁of▁sentence｜>";
constexpr const char* kDeepseekEos = "<｜end▁of▁sentence｜>";

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  DSV4_CHECK(in, "cannot open ", what, " '", path, "': ", std::strerror(errno),
             " (pass the tokenizer.json of the checkpoint, e.g. --tokenizer DIR/tokenizer.json)");
  std::ostringstream text;
  text << in.rdbuf();
  DSV4_CHECK(!in.bad(), "cannot read ", what, " '", path, "'");
  return text.str();
}

Json parse_json(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    fail(cat(source, ": invalid JSON: ", e.what()));
  }
}

// A token name in tokenizer_config.json: a string, {"content": "..."} or null.
std::optional<std::string> config_token(const Json& config, const char* key, const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  DSV4_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(), source, ": ", key,
             ": expected a string or {\"content\": ...}");
  return (*it)["content"].get<std::string>();
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  tok::Normalizer normalizer;
  tok::PreTokenizer pre_tokenizer;
  tok::BpeModel model;
  tok::AddedVocabulary added;
  std::vector<std::string> bytes;  // per id: what the ByteLevel decoder makes of the token
  std::vector<uint8_t> kind;       // per id: 0 no token, 1 token, 2 special token
  std::unordered_map<std::string, int32_t> added_ids;  // content -> id
  std::unordered_map<int32_t, std::string> added_contents;
  std::optional<int32_t> bos, eos;

  std::optional<int32_t> token_to_id(const std::string& token) const {
    const auto it = added_ids.find(token);
    return it != added_ids.end() ? std::optional<int32_t>(it->second) : model.token_to_id(token);
  }
  static std::unique_ptr<Impl> build(std::string_view json_text, const std::string& source);
  void set_special_ids(const std::optional<std::string>& bos_name, const std::optional<std::string>& eos_name,
                       bool required, const std::string& where);
};

std::unique_ptr<Tokenizer::Impl> Tokenizer::Impl::build(std::string_view json_text, const std::string& source) {
  const Json root = parse_json(json_text, source);
  DSV4_CHECK(root.is_object(), source, ": expected a JSON object at the top level");
  auto impl = std::make_unique<Tokenizer::Impl>();
  impl->source = source;
  const auto member = [&](const char* key) -> const Json& {
    static const Json null_json;
    const auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  impl->normalizer = tok::Normalizer::from_json(member("normalizer"), source + ": normalizer");
  impl->pre_tokenizer = tok::PreTokenizer::from_json(member("pre_tokenizer"), source + ": pre_tokenizer");
  impl->model = tok::BpeModel::from_json(tok::field(root, "model", source), source + ": model");

  const Json& decoder = member("decoder");
  const std::string decoder_type = decoder.is_object() && decoder.contains("type") && decoder["type"].is_string()
                                       ? decoder["type"].get<std::string>()
                                       : std::string(decoder.is_null() ? "null" : "?");
  DSV4_CHECK(decoder_type == "ByteLevel", source, ": decoder: unsupported decoder '", decoder_type,
             "' (only ByteLevel is supported)");

  std::vector<tok::AddedToken> added;
  const Json& added_json = member("added_tokens");
  DSV4_CHECK(added_json.is_null() || added_json.is_array(), source, ": added_tokens: expected an array");
  int64_t max_id = impl->model.max_id();
  for (size_t i = 0; i < added_json.size(); ++i) {
    const std::string where = cat(source, ": added_tokens[", i, "]");
    const Json& a = added_json[i];
    const Json& id = tok::field(a, "id", where);
    DSV4_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, where,
               ".id: expected a non-negative integer");
    tok::AddedToken t;
    t.id = int32_t(id.get<int64_t>());
    t.content = tok::string_field(a, "content", where);
    DSV4_CHECK(tok::find_invalid_utf8(t.content) == std::string_view::npos, where, ".content: not valid UTF-8");
    t.single_word = tok::bool_field(a, "single_word", where, false);
    t.lstrip = tok::bool_field(a, "lstrip", where, false);
    t.rstrip = tok::bool_field(a, "rstrip", where, false);
    t.normalized = tok::bool_field(a, "normalized", where, true);
    t.special = tok::bool_field(a, "special", where, false);
    max_id = std::max<int64_t>(max_id, t.id);
    added.push_back(std::move(t));
  }
  DSV4_CHECK(max_id >= 0, source, ": the vocabulary is empty");

  // Decoded bytes per id: added tokens take precedence over the model's token with the same id.
  const tok::ByteAlphabet& alphabet = tok::byte_alphabet();
  impl->bytes.assign(size_t(max_id + 1), {});
  impl->kind.assign(size_t(max_id + 1), 0);
  for (int32_t id = 0; id <= impl->model.max_id(); ++id) {
    if (const std::string* token = impl->model.id_to_token(id)) {
      alphabet.decode(*token, impl->bytes[id]);
      impl->kind[id] = 1;
    }
  }
  for (const tok::AddedToken& t : added) {
    impl->bytes[t.id].clear();
    alphabet.decode(t.content, impl->bytes[t.id]);
    impl->kind[t.id] = t.special ? 2 : 1;
    impl->added_ids.emplace(t.content, t.id);
    impl->added_contents.emplace(t.id, t.content);
  }
  impl->added = tok::AddedVocabulary(std::move(added), impl->normalizer);
  return impl;
}

void Tokenizer::Impl::set_special_ids(const std::optional<std::string>& bos_name,
                                      const std::optional<std::string>& eos_name, bool required,
                                      const std::string& where) {
  const auto lookup = [&](const std::optional<std::string>& name, const char* what) -> std::optional<int32_t> {
    if (!name) return std::nullopt;
    const std::optional<int32_t> id = token_to_id(*name);
    DSV4_CHECK(id || !required, where, ": ", what, " '", *name, "' is not in the vocabulary of ", source);
    return id;
  };
  bos = lookup(bos_name, "bos_token");
  eos = lookup(eos_name, "eos_token");
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& file_or_dir) {
  std::error_code ec;
  const std::string path = std::filesystem::is_directory(file_or_dir, ec)
                               ? (std::filesystem::path(file_or_dir) / "tokenizer.json").string()
                               : file_or_dir;
  auto impl = Impl::build(read_file(path, "tokenizer file"), path);
  const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::is_regular_file(config_path, ec)) {
    const Json config = parse_json(read_file(config_path, "tokenizer config"), config_path);
    DSV4_CHECK(config.is_object(), config_path, ": expected a JSON object at the top level");
    impl->set_special_ids(config_token(config, "bos_token", config_path),
                          config_token(config, "eos_token", config_path), true, config_path);
  } else {
    impl->set_special_ids(kDeepseekBos, kDeepseekEos, false, path);
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  auto impl = Impl::build(json_text, source);
  impl->set_special_ids(kDeepseekBos, kDeepseekEos, false, source);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool allow_special) const {
  const size_t bad = tok::find_invalid_utf8(text);
  DSV4_CHECK(bad == std::string_view::npos, "tokenizer: text to encode is not valid UTF-8 (byte offset ", bad, ")");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos) {
    DSV4_CHECK(impl_->bos.has_value(), impl_->source, ": the tokenizer has no BOS token");
    ids.push_back(*impl_->bos);
  }
  thread_local std::vector<tok::Segment> segments;
  thread_local std::vector<std::string_view> pieces;
  thread_local std::deque<std::string> arena;
  segments.clear();
  arena.clear();
  impl_->added.split(text, impl_->normalizer, allow_special, segments, arena);
  const bool byte_level = impl_->pre_tokenizer.byte_level();
  for (const tok::Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    pieces.clear();
    impl_->pre_tokenizer.split(s.text, pieces, arena);
    for (std::string_view piece : pieces) impl_->model.tokenize(piece, byte_level, ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= impl_->kind.size()) continue;
    const uint8_t k = impl_->kind[id];
    if (k == 0 || (skip_special && k == 2)) continue;
    raw += impl_->bytes[id];
  }
  if (tok::find_invalid_utf8(raw) == std::string_view::npos) return raw;
  std::string text;
  tok::append_utf8_lossy(text, raw);
  return text;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(std::string(token));
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const auto it = impl_->added_contents.find(id);
  if (it != impl_->added_contents.end()) return it->second;
  if (const std::string* token = impl_->model.id_to_token(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] == 2;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->bytes.size()) return {};
  return impl_->bytes[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::vocab_size() const { return int32_t(impl_->kind.size()); }
const std::string& Tokenizer::source() const { return impl_->source; }

// ---------------------------------------------------------------------------------------------------------
// StreamDecoder

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (!(skip_special_ && tokenizer_->is_special(id))) pending_ += tokenizer_->token_bytes(id);
  return drain();
}

std::string StreamDecoder::push(std::span<const int32_t> ids) {
  for (int32_t id : ids)
    if (!(skip_special_ && tokenizer_->is_special(id))) pending_ += tokenizer_->token_bytes(id);
  return drain();
}

// Emits everything up to the start of a trailing incomplete sequence; invalid bytes become U+FFFD here just
// as they would in decode(), because the split point is a sequence boundary of the whole byte stream.
std::string StreamDecoder::drain() {
  size_t pos = 0;
  while (pos < pending_.size()) {
    const tok::Utf8Scan scan = tok::scan_utf8(pending_, pos);
    if (scan.step == tok::Utf8Step::kIncomplete) break;
    pos += scan.length;
  }
  std::string out;
  tok::append_utf8_lossy(out, std::string_view(pending_).substr(0, pos));
  pending_.erase(0, pos);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  tok::append_utf8_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4
