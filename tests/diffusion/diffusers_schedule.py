"""diffusers' own numbers for diffusion_diffusers_test (tests/diffusion).

usage: diffusers_schedule.py OUT_DIR

Writes OUT_DIR/expected.json: DDPMScheduler's betas and alphas_cumprod for
every beta schedule dtrain supports, its add_noise and get_velocity on
float64 inputs, compute_snr and the Min-SNR-gamma weights as diffusers'
train_text_to_image.py computes them, FlowMatchEulerDiscreteScheduler's
sigmas and timesteps (shift 1 and 3), its scale_noise, and the SD3/Flux
scripts' timestep draws (compute_density_for_timestep_sampling, then
indices = (u * N).long()) with the raw draws they came from. Also two
scheduler_config.json files saved by diffusers, for dtrain's reader.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.training_utils import compute_density_for_timestep_sampling, compute_snr

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(1234)


def values(t):
    return t.detach().to(torch.float64).flatten().tolist()


expected = {"ddpm": [], "flow": []}

# The schedules: (beta_schedule, beta_start, beta_end, num_train_timesteps).
for name, start, end, n in [("linear", 0.0001, 0.02, 1000), ("scaled_linear", 0.00085, 0.012, 1000),
                            ("squaredcos_cap_v2", 0.0001, 0.02, 1000), ("linear", 0.0003, 0.03, 37),
                            ("scaled_linear", 0.001, 0.015, 50), ("squaredcos_cap_v2", 0.0001, 0.02, 20)]:
    s = DDPMScheduler(num_train_timesteps=n, beta_start=start, beta_end=end, beta_schedule=name)
    case = {"beta_schedule": name, "beta_start": start, "beta_end": end, "num_train_timesteps": n,
            "betas": values(s.betas), "alphas_cumprod": values(s.alphas_cumprod)}
    # add_noise and get_velocity on float64 samples (diffusers casts its
    # float32 alphas_cumprod to the samples' dtype): 4 records of 6 values.
    x0 = torch.from_numpy(rng.uniform(-2.0, 2.0, size=(4, 6)))
    noise = torch.from_numpy(rng.standard_normal(size=(4, 6)))
    t = torch.from_numpy(np.array([0, n // 3, n // 2 + 1, n - 1], dtype=np.int64))
    case.update({"x0": values(x0), "noise": values(noise), "t": t.tolist(),
                 "noisy": values(s.add_noise(x0, noise, t)), "velocity": values(s.get_velocity(x0, noise, t))})
    # Min-SNR-gamma as train_text_to_image.py weights it (gamma 5).
    snr = compute_snr(s, t)
    clipped = torch.stack([snr, 5.0 * torch.ones_like(t)], dim=1).min(dim=1)[0]
    case.update({"snr": values(snr), "min_snr_eps": values(clipped / snr), "min_snr_v": values(clipped / (snr + 1))})
    expected["ddpm"].append(case)

for shift in (1.0, 3.0):
    n = 1000
    s = FlowMatchEulerDiscreteScheduler(num_train_timesteps=n, shift=shift)
    case = {"shift": shift, "num_train_timesteps": n, "sigmas": values(s.sigmas), "timesteps": values(s.timesteps)}
    # The SD3 / Flux scripts: u from the density, indices = (u * N).long(),
    # timesteps and sigmas looked up; the raw draws from the same generator.
    draws = {}
    for scheme, kwargs in [("uniform", {}), ("logit_normal", {"logit_mean": 0.3, "logit_std": 1.2}),
                           ("mode", {"mode_scale": 1.29})]:
        u = compute_density_for_timestep_sampling(scheme if scheme != "uniform" else "none", batch_size=64,
                                                  generator=torch.Generator().manual_seed(7), **kwargs)
        g = torch.Generator().manual_seed(7)
        raw = (torch.normal(mean=0.3, std=1.2, size=(64,), generator=g) if scheme == "logit_normal" else
               torch.rand(size=(64,), generator=g))
        indices = (u * n).long()
        draws[scheme] = {"raw": values(raw), "u": values(u), "indices": indices.tolist(),
                         "timesteps": values(s.timesteps[indices]), "sigmas": values(s.sigmas[indices]), **kwargs}
    case["draws"] = draws
    # scale_noise (the flow forward process) on float64 samples at 4 timesteps.
    x0 = torch.from_numpy(rng.uniform(-2.0, 2.0, size=(4, 6)))
    noise = torch.from_numpy(rng.standard_normal(size=(4, 6)))
    index = [0, 250, 517, n - 1]
    noisy = torch.cat([s.scale_noise(x0[i:i + 1], s.timesteps[j:j + 1], noise[i:i + 1]) for i, j in enumerate(index)])
    case.update({"x0": values(x0), "noise": values(noise), "index": index, "noisy": values(noisy)})
    expected["flow"].append(case)

(out / "expected.json").write_text(json.dumps(expected))

# scheduler_config.json as diffusers saves it: SD 2's v-prediction DDPM, SD3's flow.
DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, prediction_type="v_prediction",
              steps_offset=1).save_config(out / "ddpm_v")
FlowMatchEulerDiscreteScheduler(shift=3.0).save_config(out / "flow_sd3")
print("wrote", out)
