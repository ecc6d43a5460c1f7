// The definitions hf/lora.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include <fstream>
#include <cctype>
#include <map>
#include <optional>
#include <string>

#include "dtrain/io/json.hpp"

#include "dtrain/hf/lora.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

namespace dtrain::hf {

DTRAIN_DECL std::vector<LinearModule> block_linears(const LmConfig& c, std::int64_t layer) {
  const std::string l = std::to_string(layer);
  if (c.gpt2()) {
    const std::string h = "transformer.h." + l + ".";
    return {{h + "attn.c_attn", "attn.qkv"},
            {h + "attn.c_proj", "attn.proj"},
            {h + "mlp.c_fc", "mlp.fc1"},
            {h + "mlp.c_proj", "mlp.fc2"}};
  }
  const std::string h = "model.layers." + l + ".";
  return {{h + "self_attn.q_proj", "attn.q"},    {h + "self_attn.k_proj", "attn.k"},
          {h + "self_attn.v_proj", "attn.v"},    {h + "self_attn.o_proj", "attn.o"},
          {h + "mlp.gate_proj", "mlp.fc1", 0},   {h + "mlp.up_proj", "mlp.fc1", 1},
          {h + "mlp.down_proj", "mlp.fc2"}};
}

namespace detail {
// PEFT's match of a listed name: the module's whole name, or a suffix after a dot.
inline bool names_module(const std::string& name, const std::string& module) {
  return module == name || (module.size() > name.size() && module.ends_with("." + name));
}

// The parse of a pattern into a tree, then its automaton (Thompson's
// construction: sets of characters, splits and jumps).
struct PatternNode {
  enum Kind : std::uint8_t { chars, cat, alt, repeat } kind = cat;
  std::bitset<256> set{};
  std::vector<PatternNode> kids{};
  int min = 1, max = 1;  // repeat: max -1 is unbounded
};

struct PatternCompiler {
  static constexpr std::size_t max_states = 20000;
  static constexpr int max_count = 1000;
  std::string_view p;
  std::size_t at = 0;
  ModulePattern& out;

  [[noreturn]] void refuse(const std::string& why) const {
    throw config_error("the pattern \"" + std::string(p) + "\" is not a regular expression dtrain takes: " + why +
                           " (at character " + std::to_string(std::min(at, p.size())) + ")",
                       "write it with literals, ., [classes], \\d \\w \\s, (groups), | and one quantifier per "
                       "item, or give module names");
  }
  bool end() const { return at >= p.size(); }
  char peek() const { return end() ? '\0' : p[at]; }

  static std::bitset<256> one(unsigned char c) {
    std::bitset<256> b;
    b.set(c);
    return b;
  }
  static std::bitset<256> range(unsigned char lo, unsigned char hi) {
    std::bitset<256> b;
    for (unsigned c = lo; c <= hi; ++c) b.set(c);
    return b;
  }
  // \d \w \s and their complements; empty when `c` names no class.
  static std::optional<std::bitset<256>> class_escape(char c) {
    std::bitset<256> b;
    switch (c) {
      case 'd': case 'D': b = range('0', '9'); break;
      case 'w': case 'W': b = range('0', '9') | range('a', 'z') | range('A', 'Z') | one('_'); break;
      case 's': case 'S': for (char w : {' ', '\t', '\n', '\r', '\f', '\v'}) b.set(static_cast<unsigned char>(w)); break;
      default: return std::nullopt;
    }
    return std::isupper(static_cast<unsigned char>(c)) ? ~b : b;
  }
  // The character an escape stands for (after the backslash, at `at`).
  unsigned char escaped_char() {
    const char c = p[at];
    const char* controls = "n\nt\tr\rf\fv\v";
    for (const char* k = controls; *k; k += 2)
      if (c == k[0]) return ++at, static_cast<unsigned char>(k[1]);
    if (std::isdigit(static_cast<unsigned char>(c))) refuse("back-references are not supported");
    if (std::isalpha(static_cast<unsigned char>(c)))
      refuse(std::string("the escape \\") + c + " is not supported");
    ++at;
    return static_cast<unsigned char>(c);
  }

  PatternNode alternatives() {
    PatternNode first = sequence();
    if (peek() != '|') return first;
    PatternNode n{.kind = PatternNode::alt};
    n.kids.push_back(std::move(first));
    while (peek() == '|') {
      ++at;
      n.kids.push_back(sequence());
    }
    return n;
  }
  PatternNode sequence() {
    PatternNode n{.kind = PatternNode::cat};
    while (!end() && peek() != '|' && peek() != ')') n.kids.push_back(repeated());
    return n;
  }
  // {m}, {m,}, {,n} or {m,n} at `at`; as Python, a brace that is none of
  // them is a literal.
  bool braces(int& min, int& max) {
    std::size_t i = at + 1;
    const auto number = [&](int& v) {
      const std::size_t from = i;
      long long n = 0;
      while (i < p.size() && std::isdigit(static_cast<unsigned char>(p[i]))) n = std::min(n * 10 + (p[i++] - '0'), 1LL << 40);
      if (i == from) return false;
      if (n > max_count) at = from, refuse("a count over " + std::to_string(max_count));
      v = static_cast<int>(n);
      return true;
    };
    int lo = 0, hi = -1;
    const bool has_lo = number(lo);
    if (i < p.size() && p[i] == '}') {
      if (!has_lo) return false;
      hi = lo;
    } else if (i < p.size() && p[i] == ',') {
      ++i;
      number(hi);
      if (i >= p.size() || p[i] != '}') return false;
    } else {
      return false;
    }
    if (hi >= 0 && hi < lo) refuse("a count range {m,n} with n below m");
    at = i + 1;
    min = lo;
    max = hi;
    return true;
  }
  bool quantifier_next() {
    const char q = peek();
    if (q == '*' || q == '+' || q == '?') return true;
    if (q != '{') return false;
    const auto keep = at;
    int lo = 0, hi = 0;
    const bool is = braces(lo, hi);
    at = keep;
    return is;
  }
  PatternNode repeated() {
    PatternNode atom_node = atom();
    int min = 1, max = 1;
    const char c = peek();
    if (c == '*') min = 0, max = -1, ++at;
    else if (c == '+') min = 1, max = -1, ++at;
    else if (c == '?') min = 0, max = 1, ++at;
    else if (c == '{' && braces(min, max)) {}
    else return atom_node;
    if (peek() == '?') ++at;  // lazy: the same names match in full
    if (quantifier_next()) refuse("stacked or possessive quantifiers are not supported");
    PatternNode n{.kind = PatternNode::repeat, .min = min, .max = max};
    n.kids.push_back(std::move(atom_node));
    return n;
  }
  PatternNode atom() {
    const char c = p[at];
    if (c == '*' || c == '+' || c == '?') refuse("nothing to repeat");
    if (c == '(') {
      ++at;
      if (peek() == '?') {
        if (p.substr(at, 2) == "?:") {
          at += 2;
        } else if (p.substr(at, 3) == "?P<") {
          const auto close = p.find('>', at);
          if (close == std::string_view::npos) refuse("an unterminated group name");
          at = close + 1;
        } else {
          refuse("(? groups other than (?:...) and (?P<name>...) are not supported");
        }
      }
      PatternNode inner = alternatives();
      if (peek() != ')') refuse("a missing )");
      ++at;
      return inner;
    }
    if (c == ')') refuse("an unbalanced )");
    if (c == '[') return bracket();
    if (c == '.') return ++at, PatternNode{.kind = PatternNode::chars, .set = ~one('\n')};
    if (c == '\\') {
      if (++at >= p.size()) refuse("a trailing backslash");
      if (const auto b = class_escape(p[at])) return ++at, PatternNode{.kind = PatternNode::chars, .set = *b};
      return PatternNode{.kind = PatternNode::chars, .set = one(escaped_char())};
    }
    if (c == '^') {
      if (at != 0) refuse("^ other than first");
      return ++at, PatternNode{.kind = PatternNode::cat};
    }
    if (c == '$') {
      if (at + 1 != p.size()) refuse("$ other than last");
      return ++at, PatternNode{.kind = PatternNode::cat};
    }
    return ++at, PatternNode{.kind = PatternNode::chars, .set = one(static_cast<unsigned char>(c))};
  }
  PatternNode bracket() {
    ++at;  // '['
    const bool negate = peek() == '^';
    if (negate) ++at;
    std::bitset<256> set;
    for (bool first = true; first || peek() != ']'; first = false) {
      if (end()) refuse("an unterminated [");
      std::optional<unsigned char> lo;
      if (p[at] == '\\') {
        if (++at >= p.size()) refuse("a trailing backslash");
        if (const auto b = class_escape(p[at])) {
          set |= *b;
          ++at;
          continue;
        }
        lo = escaped_char();
      } else {
        lo = static_cast<unsigned char>(p[at++]);
      }
      if (peek() == '-' && at + 1 < p.size() && p[at + 1] != ']') {
        ++at;
        unsigned char hi = static_cast<unsigned char>(p[at]);
        if (hi == '\\') {
          if (++at >= p.size()) refuse("a trailing backslash");
          if (class_escape(p[at])) refuse("a class escape as the end of a range");
          hi = escaped_char();
        } else {
          ++at;
        }
        if (hi < *lo) refuse("a range whose end comes before its start");
        set |= range(*lo, hi);
      } else {
        set.set(*lo);
      }
    }
    ++at;  // ']'
    return PatternNode{.kind = PatternNode::chars, .set = negate ? ~set : set};
  }

  std::int32_t push(ModulePattern::Inst i) {
    if (out.prog_.size() >= max_states) refuse("more than " + std::to_string(max_states) + " states once its counts are expanded");
    out.prog_.push_back(i);
    return static_cast<std::int32_t>(out.prog_.size() - 1);
  }
  std::int32_t here() const { return static_cast<std::int32_t>(out.prog_.size()); }
  void emit(const PatternNode& n) {
    using I = ModulePattern::Inst;
    switch (n.kind) {
      case PatternNode::chars: push({.op = I::chars, .set = n.set}); return;
      case PatternNode::cat:
        for (const auto& k : n.kids) emit(k);
        return;
      case PatternNode::alt: {
        std::vector<std::int32_t> jumps;
        for (std::size_t i = 0; i + 1 < n.kids.size(); ++i) {
          const auto s = push({.op = I::split});
          out.prog_[s].x = here();
          emit(n.kids[i]);
          jumps.push_back(push({.op = I::jump}));
          out.prog_[s].y = here();
        }
        emit(n.kids.back());
        for (const auto j : jumps) out.prog_[j].x = here();
        return;
      }
      case PatternNode::repeat: {
        for (int i = 0; i < n.min; ++i) emit(n.kids[0]);
        if (n.max < 0) {  // a loop: split into the body or out; the body jumps back
          const auto s = push({.op = I::split});
          out.prog_[s].x = here();
          emit(n.kids[0]);
          const auto j = push({.op = I::jump});
          out.prog_[j].x = s;
          out.prog_[s].y = here();
          return;
        }
        std::vector<std::int32_t> exits;  // each optional copy may be the last
        for (int i = n.min; i < n.max; ++i) {
          exits.push_back(push({.op = I::split}));
          out.prog_[exits.back()].x = here();
          emit(n.kids[0]);
        }
        for (const auto e : exits) out.prog_[e].y = here();
        return;
      }
    }
  }
};

DTRAIN_DECL ModulePattern::ModulePattern(std::string_view pattern) {
  PatternCompiler c{.p = pattern, .out = *this};
  const PatternNode tree = c.alternatives();
  if (!c.end()) c.refuse("an unbalanced )");
  c.emit(tree);
  c.push({.op = Inst::match});
}

DTRAIN_DECL bool ModulePattern::matches(std::string_view name) const {
  // Every state the automaton can be in after each character (Thompson):
  // each state once per step, so the work is name length x states.
  std::vector<std::int32_t> now, next, stack;
  std::vector<std::size_t> seen(prog_.size(), 0);
  std::size_t step = 1;
  const auto add = [&](std::vector<std::int32_t>& list, std::int32_t start) {
    stack.assign(1, start);
    while (!stack.empty()) {
      const auto pc = stack.back();
      stack.pop_back();
      if (seen[static_cast<std::size_t>(pc)] == step) continue;
      seen[static_cast<std::size_t>(pc)] = step;
      const Inst& i = prog_[static_cast<std::size_t>(pc)];
      if (i.op == Inst::jump) stack.push_back(i.x);
      else if (i.op == Inst::split) stack.push_back(i.y), stack.push_back(i.x);
      else list.push_back(pc);
    }
  };
  add(now, 0);
  for (const char ch : name) {
    ++step;
    next.clear();
    for (const auto pc : now) {
      const Inst& i = prog_[static_cast<std::size_t>(pc)];
      if (i.op == Inst::chars && i.set.test(static_cast<unsigned char>(ch))) add(next, pc + 1);
    }
    now.swap(next);
    if (now.empty()) return false;
  }
  for (const auto pc : now)
    if (prog_[static_cast<std::size_t>(pc)].op == Inst::match) return true;
  return false;
}

// The modules a LoRA model can save whole: the token embedding, GPT-2's
// learned positions and the output head, by their transformers names.
struct SavableModule {
  const char* module;
  bool LoraPlan::*flag;
  std::int64_t unit;  // the unit whose "weight" it is
  bool tied;          // one of tie_word_embeddings' pair
};

inline std::vector<SavableModule> savable_modules(const LmConfig& c) {
  const std::int64_t head = head_unit(c);
  if (c.gpt2())
    return {{"transformer.wte", &LoraPlan::save_embedding, 0, c.tie_word_embeddings},
            {"transformer.wpe", &LoraPlan::save_positions, 1, false},
            {"lm_head", &LoraPlan::save_head, head, c.tie_word_embeddings}};
  return {{"model.embed_tokens", &LoraPlan::save_embedding, 0, c.tie_word_embeddings},
          {"lm_head", &LoraPlan::save_head, head, c.tie_word_embeddings}};
}

// modules_to_save resolved as PEFT matches it: the module's whole name, or a
// suffix after a dot ("embed_tokens").
inline void plan_saved_modules(const LmConfig& c, LoraPlan& plan) {
  const auto& names = plan.config.modules_to_save;
  if (names.empty()) return;
  if (!plan.config.on())
    throw config_error("modules_to_save without LoRA adapters", "give lora_r and lora_targets, or train every weight "
                                                                "without modules_to_save");
  std::string savable;
  for (const SavableModule& m : savable_modules(c))
    if (!m.tied) savable += std::string(savable.empty() ? "" : ", ") + m.module;
  for (const std::string& name : names) {
    bool found = false;
    for (const SavableModule& m : savable_modules(c)) {
      if (!names_module(name, m.module)) continue;
      if (m.tied)
        throw config_error("modules_to_save \"" + name + "\": this " + c.model_type +
                               " model ties its output head to its token embedding (tie_word_embeddings), and "
                               "saving one of the pair is not supported",
                           "leave it out of modules_to_save" +
                               (savable.empty() ? std::string() : " (this model can save " + savable + ")"));
      plan.*m.flag = true;
      found = true;
    }
    if (!found)
      throw config_error("modules_to_save \"" + name + "\" is not supported: beside LoRA adapters dtrain trains "
                             "and saves the embeddings and the output head only",
                         savable.empty() ? "leave modules_to_save empty"
                                         : "list among " + savable + ", or adapt the module with lora_targets");
  }
}
}  // namespace detail

DTRAIN_DECL LoraPlan plan_lora(const LmConfig& c, const LoraConfig& lora) {
  LoraPlan plan{lora, std::vector<std::vector<std::string>>(static_cast<std::size_t>(c.num_hidden_layers))};
  if (lora.r < 0) throw config_error("lora_r " + std::to_string(lora.r) + " is negative", "give lora_r >= 1");
  detail::plan_saved_modules(c, plan);
  if (!lora.on()) return plan;
  if (lora.targets.empty())
    throw config_error("LoRA needs target modules", c.gpt2() ? "give lora_targets=c_attn,c_proj,c_fc (or all-linear)"
                                                              : "give lora_targets=q_proj,k_proj,v_proj,o_proj "
                                                                "(or all-linear)");
  if (lora.regex && lora.targets.size() != 1)
    throw config_error("a regular expression target is one pattern, not " + std::to_string(lora.targets.size()),
                       "give one pattern, or a list of module names");
  std::optional<detail::ModulePattern> pattern;
  if (lora.regex) pattern.emplace(lora.targets[0]);
  const auto matches = [&](const std::string& target, const std::string& module) {
    if (pattern) return pattern->matches(module);
    return target == "all-linear" || detail::names_module(target, module);
  };
  std::map<std::string, std::size_t> hits;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    bool halves[2] = {false, false};
    for (const LinearModule& m : block_linears(c, l)) {
      bool on = false;
      for (const auto& t : lora.targets) {
        if (matches(t, m.module)) {
          ++hits[t];
          on = true;
        }
      }
      if (!on) continue;
      if (m.part >= 0) {
        halves[m.part] = true;
        continue;
      }
      plan.layers[static_cast<std::size_t>(l)].push_back(m.ours);
    }
    if (halves[0] != halves[1])
      throw config_error("LoRA targets " + std::string(halves[0] ? "gate_proj" : "up_proj") + " of layer " +
                             std::to_string(l) + " without " + (halves[0] ? "up_proj" : "gate_proj") +
                             ": dtrain fuses the two projections",
                         "target both gate_proj and up_proj, or neither");
    if (halves[0]) plan.layers[static_cast<std::size_t>(l)].push_back("mlp.fc1");
  }
  // The output head: only when a target names it (PEFT's all-linear leaves
  // the output layer out), and only untied (nn::Linear adapts no tied weight).
  for (const auto& t : lora.targets) {
    if (t == "all-linear" || !matches(t, "lm_head")) continue;
    ++hits[t];
    if (c.tie_word_embeddings)
      throw config_error("LoRA target \"" + t + "\" matches lm_head, which this " + c.model_type +
                             " model ties to its token embedding (tie_word_embeddings)",
                         "adapt the blocks' layers only; the output head takes an adapter when it is untied");
    if (plan.save_head)
      throw config_error("lm_head is both a LoRA target (\"" + t + "\") and in modules_to_save",
                         "either adapt the head or train it whole, not both");
    plan.head = true;
  }
  for (const auto& t : lora.targets)
    if (!hits.contains(t)) {
      const auto example = block_linears(c, 0);
      std::string names;
      for (const auto& m : example) names += (names.empty() ? "" : ", ") + m.module.substr(m.module.rfind('.') + 1);
      throw config_error("LoRA target \"" + t + "\" matches no linear layer of this " + c.model_type + " model",
                         "target among " + names + (c.tie_word_embeddings ? "" : ", lm_head") + ", or all-linear");
    }
  return plan;
}

DTRAIN_DECL std::map<std::string, std::vector<std::string>> peft_names(const LmConfig& c, const LoraPlan& plan) {
  std::map<std::string, std::vector<std::string>> m;
  if (!plan.config.on()) return m;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string u = std::to_string(block_unit(c, l)) + ".";
    for (const LinearModule& lin : block_linears(c, l)) {
      if (!plan.adapted(l, lin.ours)) continue;
      for (const char* ab : {"lora_A", "lora_B"})
        m[u + lin.ours + "." + ab].push_back("base_model.model." + lin.module + "." + ab + ".weight");
    }
  }
  if (plan.head) {
    const std::string u = std::to_string(head_unit(c)) + ".";
    for (const char* ab : {"lora_A", "lora_B"})
      m[u + ab].push_back("base_model.model.lm_head." + std::string(ab) + ".weight");
  }
  for (const detail::SavableModule& s : detail::savable_modules(c))
    if (plan.*s.flag) m[std::to_string(s.unit) + ".weight"] = {"base_model.model." + std::string(s.module) + ".weight"};
  return m;
}

DTRAIN_DECL std::map<std::string, std::string> peft_base_layers(const LmConfig& c, const LoraPlan& plan) {
  std::map<std::string, std::string> m;
  if (plan.head)
    m[std::to_string(head_unit(c)) + ".weight"] = "base_model.model.lm_head.base_layer.weight";
  return m;
}

DTRAIN_DECL std::string adapter_config_json(const LmConfig& c, const LoraConfig& lora, const std::string& base) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base;
  j["r"] = lora.r;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["use_rslora"] = lora.rslora;
  if (lora.regex)
    j["target_modules"] = lora.targets.at(0);
  else if (lora.targets.size() == 1 && lora.targets[0] == "all-linear")
    j["target_modules"] = "all-linear";  // PEFT's own spelling is a string
  else
    j["target_modules"] = lora.targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = c.gpt2();  // GPT-2's Conv1D layers
  if (lora.modules_to_save.empty())
    j["modules_to_save"] = nullptr;
  else
    j["modules_to_save"] = lora.modules_to_save;
  j["init_lora_weights"] = true;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["use_dora"] = false;
  j["inference_mode"] = true;
  j["revision"] = nullptr;
  return j.dump(2) + "\n";
}

DTRAIN_DECL LoraConfig read_adapter_config(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "adapter_config.json";
  const std::string where = "\"" + path.string() + "\"";
  std::ifstream in(path);
  if (!in)
    throw checkpoint_error(where + " cannot be read", "give a directory written by PEFT's save_pretrained or by "
                                                      "dtrain's save_adapter");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw checkpoint_error(where + " is not valid JSON: " + e.what(), "re-save the adapter");
  }
  const auto get = [&](const char* key) -> const nlohmann::ordered_json& {
    static const nlohmann::ordered_json null;
    return j.contains(key) ? j.at(key) : null;
  };
  const auto refuse = [&](const std::string& what, const std::string& fix) {
    throw config_error(where + ": " + what + " is not supported", fix);
  };
  if (get("peft_type").is_string() && get("peft_type").get<std::string>() != "LORA")
    refuse("peft_type " + get("peft_type").get<std::string>(), "give a LoRA adapter");
  if (get("use_dora").is_boolean() && get("use_dora").get<bool>()) refuse("use_dora (DoRA)", "train a plain LoRA adapter");
  if (get("bias").is_string() && get("bias").get<std::string>() != "none")
    refuse("bias \"" + get("bias").get<std::string>() + "\"", "train the adapter with bias=\"none\"");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (!get(k).is_null() && !(get(k).is_object() && get(k).empty()))
      refuse(k, "train the adapter with one rank and alpha for every layer");
  if (!get("layers_to_transform").is_null()) refuse("layers_to_transform", "adapt every layer, or name the layers' modules in target_modules");
  LoraConfig lora;
  try {
    const auto number = [&]<class T>(const char* key, T& out) {
      if (const auto x = ::dtrain::detail::json_number<T>(get(key))) out = *x;
      else
        throw checkpoint_error(where + ": " + key + " is " + ::dtrain::detail::json_shown(get(key)) + ", not " +
                                   (std::is_integral_v<T> ? "an integer" : "a finite number"),
                               "re-save the adapter with PEFT");
    };
    number("r", lora.r);
    if (!get("lora_alpha").is_null()) number("lora_alpha", lora.alpha);
    if (!get("lora_dropout").is_null()) number("lora_dropout", lora.dropout);
    if (get("use_rslora").is_boolean()) lora.rslora = get("use_rslora").get<bool>();
    if (!get("modules_to_save").is_null()) lora.modules_to_save = get("modules_to_save").get<std::vector<std::string>>();
    const auto& t = get("target_modules");
    if (t.is_string()) {
      lora.targets = {t.get<std::string>()};
      lora.regex = lora.targets[0] != "all-linear";
    } else {
      lora.targets = t.get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw checkpoint_error(where + ": r, lora_alpha, lora_dropout, use_rslora, target_modules or modules_to_save is "
                                   "missing or of the wrong type (" + e.what() + ")",
                           "re-save the adapter with PEFT");
  }
  if (lora.r < 1) throw checkpoint_error(where + ": r " + std::to_string(lora.r) + " is not a rank", "re-save the adapter");
  return lora;
}

}  // namespace dtrain::hf

DTRAIN_IMPL_END
