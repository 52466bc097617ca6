import subprocess,os,difflib,sys,re
def trial(text, lang, chat=False):
    first=text.split("\n",1)[0]
    p="Here is a file:\n\n```"+lang+"\n"+text+"\n```\n\nThe same file, copied exactly:\n\n```"+lang+"\n"+first
    r=subprocess.run(['/work/main/target/release/hf2q','-v','generate','-m',os.path.expanduser('~/.cache/hf2q/models/SmolLM2-135M-Instruct.Q8_0.gguf'),'-p',p,'-n','1000','--temp','0','-t','2','--spec','off'],capture_output=True,text=True)
    out=r.stdout; rest=text[len(first):]
    pre=0
    for a,b in zip(out,rest):
        if a!=b: break
        pre+=1
    sm=difflib.SequenceMatcher(None,rest.split(),out.split(),autojunk=False)
    print(lang, len(rest), pre, round(sum(b.size for b in sm.get_matching_blocks())/len(rest.split()),3), re.findall(r"generated.*", r.stderr))
s=open('/work/main/crates/engine/src/backend/cuda/kv.rs').read()
i=s.index('\nimpl'); trial(s[i+1:i+3800].rsplit("\n",1)[0], "rust")
t=open('/work/main/bench/cuda/device.sh').read()
j=t.index('bg_model() {'); trial(t[j:j+3800].rsplit("\n",1)[0], "bash")
