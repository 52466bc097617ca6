"""Device-to-device copy bandwidth (read + write), the roofline's denominator for #19's figures."""
import torch

x = torch.randn(1 << 30, device="cuda")  # 4 GiB
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record()
    y.copy_(x)
    e.record()
    torch.cuda.synchronize()
    ts.append(s.elapsed_time(e) / 1e3)
ts.sort()
t = ts[len(ts) // 2]
print(f"device-to-device copy: {2 * x.numel() * 4 / t / 1e12:.2f} TB/s (read + write, 4 GiB, median of 10)")
