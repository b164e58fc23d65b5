# Writes the small synthetic Kineto traces of this folder (README.md describes each). Run: python3 make_traces.py
import json
PID=1000
def meta(tid,name,pid=PID): return {"ph":"M","name":"thread_name","pid":pid,"tid":tid,"args":{"name":name}}
class T:
    def __init__(s): s.ev=[]; s.corr=1
    def X(s,cat,name,tid,ts,dur,pid=PID,**args):
        e={"ph":"X","cat":cat,"name":name,"pid":pid,"tid":tid,"ts":round(ts,3),"dur":round(dur,3)}
        if args: e["args"]=args
        s.ev.append(e); return e
    def launch(s,tid,ts,kts,kdur,stream=7,name="cudaLaunchKernel",kname="gemm"):
        c=s.corr; s.corr+=1
        s.X("cuda_runtime",name,tid,ts,5,correlation=c)
        s.X("kernel",kname,stream,kts,kdur,pid=0,device=0,stream=stream,correlation=c)
    def copy(s,tid,ts,dur,cts,cdur,kind,nbytes,stream=7):
        c=s.corr; s.corr+=1
        s.X("cuda_runtime","cudaMemcpyAsync",tid,ts,dur,correlation=c)
        s.X("gpu_memcpy",kind,stream,cts,cdur,pid=0,device=0,stream=stream,correlation=c,bytes=nbytes)
    def dump(s,path,threads):
        doc={"schemaVersion":1,"deviceProperties":[{"id":0,"name":"synthetic GPU"}],
             "traceEvents":[meta(t,n) for t,n in threads]+[meta(7,"stream 7 ",0)]+s.ev}
        json.dump(doc,open(path,"w"),indent=0)
import os
D=os.path.dirname(os.path.abspath(__file__))+"/"
# A: a training loop without a profiler schedule (no ProfilerStep#): the main thread waits in the
# DataLoader, the autograd engine thread launches the backward kernels (more API calls than the main thread).
t=T()
for i in range(3):
    b=i*10000.0
    t.X("user_annotation","enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",PID,b,6000)
    for k in range(3): t.launch(PID,b+6000+k*100,b+6000+k*500,500)
    for k in range(6): t.launch(1001,b+7500+k*50,b+7500+k*330,330)
t.dump(D+"training_no_steps.json",[(PID,"thread 1000 (pt_main_thread)"),(1001,"thread 1001 (pt_autograd_0)")])
# B: naive egress: compute, a blocking D2H copy into pageable memory, then the output processed inline in
# plain Python that no profiler op records, 6 ms per step while the GPU idles.
t=T()
for i in range(4):
    b=i*10000.0
    t.X("user_annotation","ProfilerStep#%d"%i,PID,b,10000)
    t.launch(PID,b+10,b+20,3000)
    t.copy(PID,b+3000,600,b+3100,400,"Memcpy DtoH (Device -> Pageable)",4000000)
    t.X("cpu_op","aten::empty",PID,b+3650,20)
t.dump(D+"uncovered_output.json",[(PID,"thread 1000 (python)")])
# C: a value read back every step: a 704-byte D2H copy into pageable memory whose cudaMemcpyAsync waits
# 78 ms for work queued before it (the stream waits on an event of work another thread launches late),
# while the GPU idles.
t=T()
for i in range(3):
    b=i*100000.0
    t.X("user_annotation","ProfilerStep#%d"%i,PID,b,100000)
    t.launch(PID,b+10,b+20,10000)
    t.copy(PID,b+10100,78000,b+88050,10,"Memcpy DtoH (Device -> Pageable)",704)
    t.launch(1001,b+85000,b+86000,2000,stream=9)
    for k in range(5): t.launch(PID,b+88200+k*10,b+88300+k*1000,1000)
t.dump(D+"blocking_readback.json",[(PID,"thread 1000 (python)"),(1001,"thread 1001 (python)")])
