import sys
# 1: List of 256 ConfigMaps in ~1 MiB YAML
per = (1024*1024 - 4096)//256 - 200
with open('list.yaml','w') as f:
    f.write("apiVersion: v1\nkind: List\nitems:\n")
    for i in range(256):
        f.write(f"- apiVersion: v1\n  kind: ConfigMap\n  metadata: {{name: cm-{i}}}\n  data:\n    k: \"{'x'*per}\"\n")
# 2: densest YAML: flow sequence of one-letter values, ~1 MiB
n = (1024*1024 - 100)//2
with open('dense.yaml','w') as f:
    f.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: d}\ndata: {k: [" + ",".join(['a']*n) + "]}\n")
# 3: alias bomb: a 256 KiB string aliased many times, ~700 KB
big = 'y'*(256*1024)
with open('bomb.yaml','w') as f:
    f.write(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: b}}\nx: &a \"{big}\"\ndata:\n")
    i=0
    while f.tell() < 700*1024:
        f.write(f"  k{i}: *a\n"); i+=1
