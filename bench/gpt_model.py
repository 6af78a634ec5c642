"""kiln's `gpt` model in Python PyTorch, for the benchmarks that set kiln against Python on the
same job (precision, memory, ddp): pre-norm blocks of causal self-attention and a GELU MLP,
learned positions, an untied head, dropout where kiln's has it, GPT-2 initialisation.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        # Built per forward, not a buffer: DDP would broadcast a buffer every forward, and Gloo
        # has no bool (kiln's gpt keeps its mask out of the buffers for the same reason).
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        att = self.drop(torch.softmax(att.masked_fill(mask, float("-inf")), -1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab=64, seq=64, d=128, layers=4, heads=4, dropout=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.drop = nn.Dropout(dropout)
        for m in self.modules():  # GPT-2 initialisation, as kiln's gpt
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for b in self.blocks:
            nn.init.normal_(b.proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))
            nn.init.normal_(b.out.weight, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, x):
        h = self.drop(self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device)))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))
