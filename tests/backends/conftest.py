"""Shared set-up for the core tests: one thread (the test machine is shared), no network."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)
