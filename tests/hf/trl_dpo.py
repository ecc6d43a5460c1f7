"""The DPO reference for trl_test: TRL's DPOTrainer (the pinned torch2
set) computing its loss on the very pairs dtrain trained on.

usage:
  trl_dpo.py prepare MODEL_DIR OUT_DIR
      writes OUT_DIR/pairs.jsonl (36 pairs of random token ids: prompts of 2-6
      tokens, completions of 1-7, each sequence at most 16 tokens) and
      OUT_DIR/adapter (a PEFT LoRA adapter, r 4, alpha 8, on q_proj and v_proj,
      its A and B both random, so the policy starts away from its base)
  trl_dpo.py replay MODEL_DIR CASES_JSON OUT_FILE
      CASES_JSON: a list of {"name", "dump": DIR, "ranks", "steps", "loss_type",
      "beta", "label_smoothing", "reference": "base" | "copy", "adapter": DIR or
      "", "optimizer": "sgd" | "adamw", "lr"}. For each case, step by step: the
      pairs of every rank's micro-batches of that step, from the batches
      train_lm dump_batches= wrote (x and y give back each pair's prompt and
      completions), collated by TRL's DataCollatorForPreference into one
      batch, DPOTrainer.compute_loss on it, backward, and a torch optimizer
      step (SGD without momentum, or AdamW betas 0.9/0.999, eps 1e-8, no
      weight decay). The reference is TRL's: the policy with its adapters
      disabled (reference base: a new adapter from peft_config, given the
      adapter's weights, without ref_model) or a frozen copy of MODEL_DIR
      passed as ref_model (reference copy).
      Writes to OUT_FILE, per case: <name>.loss [steps], <name>.<metric>
      [steps] for TRL's rewards/chosen, rewards/rejected, rewards/accuracies,
      rewards/margins, logps/chosen, logps/rejected, and <name>.param.<name> after the last step (the adapters under PEFT's
      saved names, or every parameter under transformers' names).
"""
import json
import os
import random
import sys
import tempfile

import torch


def prepare(model_dir, out):
    import peft
    import transformers
    config = transformers.AutoConfig.from_pretrained(model_dir)
    rng = random.Random(7)
    with open(os.path.join(out, "pairs.jsonl"), "w") as f:
        for _ in range(36):
            prompt = [rng.randrange(config.vocab_size) for _ in range(rng.randint(2, 6))]
            room = config.max_position_embeddings - len(prompt)
            chosen = [rng.randrange(config.vocab_size) for _ in range(rng.randint(1, min(7, room)))]
            rejected = [rng.randrange(config.vocab_size) for _ in range(rng.randint(1, min(7, room)))]
            f.write(json.dumps({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}) + "\n")
    torch.manual_seed(11)
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(base, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(os.path.join(out, "adapter"))


def tokenizer(vocab_size):
    """A word-level tokenizer over the model's ids: TRL wants one for its pad id (0, as dtrain pads)."""
    import tokenizers
    import transformers
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")


def pairs_of(x, y):
    """Each pair of one dumped micro-batch: its 2P rows, the chosen first (dtrain's and TRL's layout)."""
    n = x.shape[0] // 2

    def sequence(r):
        scored = (y[r] != -100).nonzero().flatten()
        first, last = int(scored[0]), int(scored[-1])
        ids = x[r, :last + 1].tolist() + [int(y[r, last])]
        return ids[:first + 1], ids[first + 1:]

    out = []
    for i in range(n):
        prompt, chosen = sequence(i)
        prompt_r, rejected = sequence(n + i)
        assert prompt == prompt_r, "a pair's two sequences share their prompt"
        out.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return out


def step_pairs(dump, ranks, step):
    from safetensors.torch import load_file
    pairs = []
    for r in range(ranks):
        t = load_file(os.path.join(dump, f"rank-{r}.safetensors"))
        k = 0
        while f"{step}.{k}.x" in t:
            pairs += pairs_of(t[f"{step}.{k}.x"], t[f"{step}.{k}.y"])
            k += 1
    return pairs


METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected"]


def replay(model_dir, case, result):
    import datasets
    import peft
    import transformers
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # A new adapter (peft_config: TRL's reference is then the base, its adapters disabled) given the
    # prepared adapter's weights below. (An adapter TRL loads itself, a PeftModel, becomes its own
    # starting copy's reference instead.)
    lora = peft.LoraConfig.from_pretrained(case["adapter"]) if case["adapter"] else None
    if lora is not None:
        lora.inference_mode = False  # as saved; trainable here
    ref = None
    if case["reference"] == "copy":
        ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # The trainer tokenizes its dataset of text when it starts; the batches come from the dump instead.
    # bf16=False: a float32 run, as train_lm's precision=fp32 (TRL's default, bf16 mixed precision,
    # would run the reference model under bf16 autocast).
    text = datasets.Dataset.from_list([{"prompt": "t2 t3", "chosen": " t4", "rejected": " t5"}] * 2)
    with tempfile.TemporaryDirectory() as tmp:
        args = DPOConfig(output_dir=tmp, beta=case["beta"], loss_type=[case["loss_type"]],
                         label_smoothing=case["label_smoothing"], report_to="none", use_cpu=True,
                         disable_dropout=True, max_length=None, bf16=False, fp16=False)
        trainer = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=text,
                             processing_class=tokenizer(model.config.vocab_size), peft_config=lora)
    model = trainer.model
    if lora is not None:
        from safetensors.torch import load_file
        weights = load_file(os.path.join(case["adapter"], "adapter_model.safetensors"))
        loaded = peft.set_peft_model_state_dict(model, weights)
        assert not loaded.unexpected_keys, loaded.unexpected_keys
    model.train()
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in trained]
    if case["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(params, lr=case["lr"], momentum=0.0)
    else:
        optimizer = torch.optim.AdamW(params, lr=case["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    collate = DataCollatorForPreference(pad_token_id=0)
    name = case["name"]
    losses, metrics = [], {m: [] for m in METRICS}
    for step in range(1, case["steps"] + 1):
        inputs = collate(step_pairs(case["dump"], case["ranks"], step))
        optimizer.zero_grad()
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        for m in METRICS:
            metrics[m].append(trainer._metrics["train"][m][-1])
    result[name + ".loss"] = torch.tensor(losses, dtype=torch.float64)
    for m in METRICS:
        result[name + "." + m] = torch.tensor(metrics[m], dtype=torch.float64)
    if case["adapter"]:
        state = peft.get_peft_model_state_dict(model)
    else:
        state = {n: p for n, p in trained}
    for n, p in state.items():
        result[name + ".param." + n] = p.detach().clone().contiguous()


def main():
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3])
        return
    from safetensors.torch import save_file
    model_dir, cases, out = sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
    result = {}
    for case in cases:
        replay(model_dir, case, result)
    save_file(result, out)


main()
