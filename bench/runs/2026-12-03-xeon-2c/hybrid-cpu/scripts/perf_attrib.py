import subprocess, sys, re, collections
data = sys.argv[1]; binp = "/tmp/hyb/hf2q"
mm = subprocess.run(["perf","script","-i",data,"--show-mmap-events"],capture_output=True,text=True).stdout
m = re.search(r"\[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+) .*?r-xp /tmp/hyb/hf2q", mm)
base, size, pgoff = (int(x,16) for x in m.groups())
out = subprocess.run(["perf","script","-i",data,"-F","ip,sym,dso"],capture_output=True,text=True).stdout
cnt = collections.Counter(); other = collections.Counter(); total = 0
for line in out.splitlines():
    p = line.split()
    if not p: continue
    total += 1
    ip = int(p[0],16)
    if base <= ip < base+size: cnt[ip - base + pgoff + 0x1000] += 1
    else:
        s = " ".join(p[1:]); other[s[:70]] += 1
ips = sorted(cnt)
a2l = subprocess.run(["addr2line","-f","-i","-C","-e",binp], input="".join(hex(x)+"\n0x0\n" for x in ips), capture_output=True, text=True).stdout.splitlines()
groups, cur, i = [], [], 0
while i < len(a2l):
    f, loc = a2l[i], a2l[i+1]; i += 2
    if f == "??" and loc.startswith("??:"): groups.append(cur); cur = []
    else: cur.append((f, loc))
def cat(g):
    names = [(re.sub(r"<.*?>","",f), loc) for f, loc in g]
    for f, loc in names:
        if "recurrent.rs" in loc:
            for ff, ll in names:
                if "recurrent.rs" in ll and re.search(r"\b(chunk|recurrent_token)\b", ff): return "delta rule (recurrent.rs chunk/recurrent_token)"
            for ff, ll in names:
                if "ssm_conv" in ff: return "ssm_conv (recurrent.rs)"
            return "recurrent.rs other: " + names[-1][0][-80:]
        if "attn.rs" in loc: return "attention (attn.rs)"
        if "quant/src/dot" in loc or "quant::dot" in f: return "quantized matmul (quant::dot)"
    outer = names[-1] if names else ("?","?")
    for f, loc in names:
        if "/crates/" in loc: return f[-70:] + " @" + loc.split("/crates/")[1].rsplit(":",1)[0]
    return outer[0][-80:]
res = collections.Counter()
for ip, g in zip(ips, groups): res[cat(g)] += cnt[ip]
print(f"{data}: {total} samples (both threads); {sum(other.values())} outside hf2q's text")
for k, v in res.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 14): print(f"{100*v/total:6.2f}%  {k}")
for k, v in other.most_common(5): print(f"{100*v/total:6.2f}%  [{k}]")
