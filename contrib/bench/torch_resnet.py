#!/usr/bin/env python3
"""ResNet-18 in PyTorch, timed on the CPU: the peer of trainrun in
contrib/bench/cpu_resnet.sh.

Same model as trainrun's resnet { depth = 18, stem = "small" }
(lua/trainrun/models.lua, contrib/bench/resnet-bench.lua): torchvision's
ResNet-18 (basic blocks [2,2,2,2], widths 64/128/256/512, batch norm,
1x1 stride-2 projection shortcuts) with the small stem: one 3x3 stride-1
convolution, batch norm and ReLU, no max pool.  Same training step: mean
cross-entropy, SGD with momentum 0.9 and weight decay 5e-4 on every
parameter, lr 0.05.  Random images made up front (data is not what is
timed), eager mode, as a PyTorch user would write it; --channels-last
stores images and weights channel-last (NHWC, trainrun's layout), which
oneDNN-backed convolutions in PyTorch also take.

Prints one line that cpu_resnet.sh reads (cpu_ms_per_step: the process's
user + system CPU time per step, all threads, which stays meaningful on a
loaded machine when wall time does not):
  RESULT ms_per_step=.. cpu_ms_per_step=.. images_per_s=.. peak_rss_mib=.. params=.. torch=..

  python3 torch_resnet.py --batch 32 --size 64 --threads 2
  python3 torch_resnet.py ... --channels-last --bf16   # NHWC, torch.autocast("cpu", bfloat16)
"""

import argparse
import resource
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit("torch_resnet.py: PyTorch is not importable (%s)" % e)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, width=64, classes=10, channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for s in range(4):
            cout = width * 2 ** s
            layers.append(nn.Sequential(BasicBlock(cin, cout, 1 if s == 0 else 2),
                                        BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64, help="image height and width")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--bf16", action="store_true",
                    help='forward under torch.autocast("cpu", dtype=torch.bfloat16)')
    ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = ResNet18(a.width, a.classes).to(memory_format=fmt)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=a.lr, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(a.batch, 3, a.size, a.size, generator=g).mul_(2).sub_(1)
                .contiguous(memory_format=fmt),
                torch.randint(0, a.classes, (a.batch,), generator=g)) for _ in range(2)]

    def step(i):
        images, targets = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(images)
        loss = F.cross_entropy(logits.float(), targets)
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(a.warmup):
        step(i)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(a.steps):
        loss = step(a.warmup + i)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print("loss after %d steps: %.4f" % (a.warmup + a.steps, loss), file=sys.stderr)
    print("RESULT ms_per_step=%.1f cpu_ms_per_step=%.1f images_per_s=%.1f peak_rss_mib=%.0f "
          "params=%d torch=%s"
          % (1e3 * seconds / a.steps, 1e3 * cpu / a.steps, a.batch * a.steps / seconds, rss_mib,
             sum(p.numel() for p in params), torch.__version__.split("+")[0]))


if __name__ == "__main__":
    main()
