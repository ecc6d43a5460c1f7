"""TRL's DPO step under PyTorch DDP (gloo, CPU): the peer of train_lm
objective=dpo in the RL benchmark (bench/run_rl_bench.sh).

usage: trl_dpo_ddp.py --model-dir DIR --pairs FILE --pairs-per-rank P --steps N --warmup W --json OUT

Loads the model of DIR (transformers, fp32, SDPA attention), a frozen copy
of it as the reference (TRL's ref_model for full fine-tuning), and builds a
DPOTrainer (TRL's sigmoid loss, beta 0.1, float32: bf16 off) whose
compute_loss each step runs on P pairs of FILE per rank (rank r takes its
own pairs, as train_lm's sampler does), collated by TRL's
DataCollatorForPreference, with the model wrapped in DistributedDataParallel
over gloo and torch's fused AdamW (lr 1e-6, weight decay 0). Each step is
timed from zero_grad through optimizer.step on rank 0; the JSON has every
step's milliseconds, the median after the warm-up and the versions. Launch
one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set
(dtrain-run does); the trainer itself is built as a single process (its
metrics are not gathered), DDP does the gradients' all-reduce.
"""

import argparse
import json
import os
import resource
import statistics
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", os.environ["OPENBLAS_NUM_THREADS"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model-dir", required=True)
parser.add_argument("--pairs", required=True)
parser.add_argument("--pairs-per-rank", type=int, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--warmup", type=int, required=True)
parser.add_argument("--json", required=True)
args = parser.parse_args()

import datasets  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DataCollatorForPreference  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                          attn_implementation="sdpa")
ref = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                        attn_implementation="sdpa")
vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="t0"))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")
text = datasets.Dataset.from_list([{"prompt": "t2 t3", "chosen": " t4", "rejected": " t5"}] * 2)
# The trainer as one process: without the launcher's variables accelerate sees no distributed job.
saved = {k: os.environ.pop(k, None) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
with tempfile.TemporaryDirectory() as tmp:
    trainer = DPOTrainer(model=model, ref_model=ref, processing_class=tokenizer, train_dataset=text,
                         args=DPOConfig(output_dir=tmp, beta=0.1, report_to="none", use_cpu=True, bf16=False,
                                        fp16=False, max_length=None))
for k, v in saved.items():
    if v is not None:
        os.environ[k] = v
dist.init_process_group("gloo")
model = trainer.model
model.train()
ddp = DDP(model) if world > 1 else model
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, weight_decay=0.0,
                              fused=True)
pairs = [json.loads(line) for line in open(args.pairs)]
collate = DataCollatorForPreference(pad_token_id=0)
times = []
for step in range(args.steps):
    first = (step * world + rank) * args.pairs_per_rank
    inputs = collate([pairs[(first + i) % len(pairs)] for i in range(args.pairs_per_rank)])
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(ddp, inputs)
    loss.backward()
    optimizer.step()
    times.append((time.perf_counter() - start) * 1000.0)
if rank == 0:
    with open(args.json, "w") as f:
        json.dump({"step_ms": times, "median_ms": statistics.median(times[args.warmup:]),
                   "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}, f)
dist.destroy_process_group()
