"""The GRPO reference for trl_test: TRL's GRPOTrainer (the pinned torch2
set) computing its loss on completions fixed beforehand.

usage: trl_grpo.py MODEL_DIR ADAPTER_DIR BATCH_FILE BETA EPSILON NUM_GENERATIONS OUT_FILE
  BATCH_FILE (safetensors, written by the test): x, y [B, T] int64 as
  dtrain's batch (each row a prompt then a completion, y the next ids on
  the completion, -100 elsewhere), rewards [B], old_logps and ref_logps
  [B, T] float32 (per row of x: the log-probability of y there).
  Rebuilds TRL's inputs (prompts left-padded, completions right-padded,
  their masks, old_per_token_logps and ref_per_token_logps on the
  completion tokens), computes the advantages as GRPOTrainer does
  (scale_rewards "group": the group's mean and nanstd, + 1e-4), then calls
  GRPOTrainer._compute_loss (loss_type "dapo", TRL's default) on the model
  with the adapter loaded into a new PEFT adapter (as peft_config makes it),
  in float32, and backward.
Writes OUT_FILE: loss [1], advantages [B], metric.<name> [1] for kl and
the clip ratios, and grad.<name> for each adapter tensor (PEFT's saved
names).
"""
import os
import sys
import tempfile

import torch


def main():
    import datasets
    import peft
    import transformers
    from safetensors.torch import load_file, save_file
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd

    model_dir, adapter, batch_file, beta, epsilon, groups, out = sys.argv[1:8]
    beta, epsilon, groups = float(beta), float(epsilon), int(groups)
    b = load_file(batch_file)
    x, y = b["x"], b["y"]
    rows = []
    for r in range(x.shape[0]):
        scored = (y[r] != -100).nonzero().flatten()
        first, last = int(scored[0]), int(scored[-1])
        ids = x[r, :last + 1].tolist() + [int(y[r, last])]
        rows.append((ids[:first + 1], ids[first + 1:], first))
    n, plen, clen = len(rows), max(len(p) for p, _, _ in rows), max(len(c) for _, c, _ in rows)
    prompt_ids = torch.zeros(n, plen, dtype=torch.long)
    prompt_mask = torch.zeros(n, plen, dtype=torch.long)
    completion_ids = torch.zeros(n, clen, dtype=torch.long)
    completion_mask = torch.zeros(n, clen, dtype=torch.long)
    old = torch.zeros(n, clen)
    ref = torch.zeros(n, clen)
    for r, (p, c, first) in enumerate(rows):
        prompt_ids[r, plen - len(p):] = torch.tensor(p)
        prompt_mask[r, plen - len(p):] = 1
        completion_ids[r, :len(c)] = torch.tensor(c)
        completion_mask[r, :len(c)] = 1
        # completion token j is predicted at row position first + j of dtrain's x
        old[r, :len(c)] = b["old_logps"][r, first:first + len(c)]
        ref[r, :len(c)] = b["ref_logps"][r, first:first + len(c)]

    # GRPOTrainer's advantages (scale_rewards "group")
    rewards = b["rewards"].double()
    grouped = rewards.view(-1, groups)
    mean = grouped.mean(dim=1).repeat_interleave(groups)
    std = nanstd(grouped, dim=1).repeat_interleave(groups)
    advantages = (rewards - mean) / (std + 1e-4)

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = peft.LoraConfig.from_pretrained(adapter)
    lora.inference_mode = False
    text = datasets.Dataset.from_list([{"prompt": "t2 t3"}] * groups)

    def reward(completions, **kwargs):
        return [0.0] * len(completions)

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    import tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")
    with tempfile.TemporaryDirectory() as tmp:
        # bf16=False: a float32 run, as dtrain's fp32 (TRL's default is bf16 autocast)
        args = GRPOConfig(output_dir=tmp, beta=beta, epsilon=epsilon, num_generations=groups,
                          per_device_train_batch_size=groups, report_to="none", use_cpu=True, bf16=False,
                          fp16=False, disable_dropout=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=text,
                              processing_class=tokenizer, peft_config=lora)
    model = trainer.model
    loaded = peft.set_peft_model_state_dict(model, load_file(os.path.join(adapter, "adapter_model.safetensors")))
    assert not loaded.unexpected_keys, loaded.unexpected_keys
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": advantages.float(), "old_per_token_logps": old,
              "num_items_in_batch": completion_mask.sum()}
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    result = {"loss": loss.detach().double().reshape(1), "advantages": advantages.contiguous()}
    for name in ["kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]:
        if name in trainer._metrics["train"]:
            result["metric." + name] = torch.tensor([trainer._metrics["train"][name][-1]], dtype=torch.float64)
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    state_names = peft.get_peft_model_state_dict(model).keys()
    for name in state_names:  # "base_model.model.<module>.lora_A.weight" <- "...lora_A.default.weight"
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        result["grad." + name] = grads[key].detach().clone().contiguous()
    save_file(result, out)


main()
