"""Shared set-up for the callback tests: one thread, no network, W&B never online."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)
