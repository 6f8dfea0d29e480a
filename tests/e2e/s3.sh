#!/bin/sh
# The s3 checkpoint plugin against a real S3 API: moto's standalone server,
# on 127.0.0.1 only.  Skipped (77) without moto (pip install 'moto[server]').
#   a) train with background uploads; LATEST is never ahead of its objects
#   b) resume in a new run directory, from the bucket alone
#   c) the server dies in the middle of an upload: LATEST stays on the last
#      complete checkpoint and the run says why; uploading in commit, the run
#      fails (its last checkpoint did not land); uploading in the background,
#      the next run uploads the staged copy and resumes from it
#   d) signatures: moto with authentication on, and botocore recomputing the
#      signature of every request for a prefix that needs escaping
#   e) credentials: from ~/.aws/credentials (a profile); never to an endpoint
#      only the recipe named, never from a variable the recipe named
#   f) a sharded checkpoint: every rank uploads its blob, rank 0 publishes;
#      resumed from the bucket at 1 and 3 ranks
. "$(dirname "$0")/lib.sh"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" > /dev/null 2>&1 || skip "python3 is not installed (needed for moto)"
"$PYTHON" -c "import moto.server, boto3, botocore" 2> /dev/null ||
  skip "moto is not installed: pip install 'moto[server]'"
PLUGIN_DIR=${TR_PLUGIN_BUILD_DIR:-}
[ -n "$PLUGIN_DIR" ] && [ -f "$PLUGIN_DIR/checkpoint_s3.so" ] ||
  skip "checkpoint_s3.so was not built (configure found no libcurl: install libcurl4-openssl-dev)"
TRAINRUN_PLUGIN_PATH="$PLUGIN_DIR${TRAINRUN_PLUGIN_PATH:+:$TRAINRUN_PLUGIN_PATH}"
export TRAINRUN_PLUGIN_PATH

pids=""
cleanup() {
  for p in $pids; do kill "$p" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

cat > s3tool.py << 'EOF'
"""Test helpers: free ports, the bucket, invariant checks, a dying proxy."""
import hashlib, json, socket, struct, sys, threading, time, urllib.request
import boto3, botocore

def client(endpoint, key="testing", secret="testing"):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()

def wait_up(endpoint):
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            return
        except Exception:
            time.sleep(0.1)
    sys.exit("moto did not start at " + endpoint)

def make_bucket(endpoint, bucket):
    client(endpoint).create_bucket(Bucket=bucket)

def read(s3, bucket, key):
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except botocore.exceptions.ClientError as e:
        if e.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise

def check(s3, bucket, prefix, verify_data):
    """LATEST names a checkpoint whose MANIFEST and blobs are all there.
    Returns LATEST's name ('' when absent), raises on a violation."""
    latest = read(s3, bucket, prefix + "LATEST")
    if latest is None:
        return ""
    name = latest.decode().strip()
    manifest = read(s3, bucket, prefix + name + "/MANIFEST")
    if manifest is None:
        raise AssertionError("LATEST names %s, which has no MANIFEST" % name)
    lines = manifest.decode().splitlines()
    assert lines[0] == "trainrun-s3-manifest 1", lines[0]
    assert len(lines) > 1, "empty MANIFEST"
    for line in lines[1:]:
        sha, size, blob = line.split(" ", 2)
        key = prefix + name + "/" + blob
        if verify_data:
            data = read(s3, bucket, key)
            assert data is not None, "LATEST names %s, but %s is missing" % (name, key)
            assert len(data) == int(size), "%s: %d bytes, MANIFEST says %s" % (key, len(data), size)
            assert hashlib.sha256(data).hexdigest() == sha, key + ": SHA-256 differs from MANIFEST"
        else:
            head = s3.head_object(Bucket=bucket, Key=key)
            assert head["ContentLength"] == int(size), key
    return name

def check_cmd(endpoint, bucket, prefix):
    print(check(client(endpoint), bucket, prefix, True))

def watch(endpoint, bucket, prefix, stop_file):
    """Check the invariant continuously until stop_file exists."""
    import os
    s3, seen = client(endpoint), 0
    check(s3, bucket, prefix, False)
    open(stop_file + ".ready", "w").write("ready")
    while not os.path.exists(stop_file):
        try:
            check(s3, bucket, prefix, False)
        except botocore.exceptions.ClientError:
            pass  # a blob pruned between two reads; not a violation
        seen += 1
        time.sleep(0.02)
    print(seen)

def manifests(endpoint, bucket, prefix):
    keys = [o["Key"] for o in client(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    print(" ".join(sorted(k[len(prefix):-len("/MANIFEST")] for k in keys if k.endswith("/MANIFEST"))))

def proxy(port_file, target, marker, after):
    """Forward to 127.0.0.1:target until `marker` has gone by plus `after`
    bytes; then reset every connection and stop listening, as a server that
    died would."""
    marker, after = marker.encode(), int(after)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    with open(port_file, "w") as f:
        f.write(str(listener.getsockname()[1]))
    conns, dead, lock = [], threading.Event(), threading.Lock()

    def die():
        with lock:
            if dead.is_set():
                return
            dead.set()
            for c in conns:
                try:
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    c.close()
                except OSError:
                    pass
            listener.close()

    def pump(src, dst, watch_stream):
        tail, budget = b"", None
        try:
            while not dead.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if watch_stream and budget is None:
                    if (tail + data).find(marker) >= 0:
                        budget = after
                    tail = (tail + data)[-len(marker):]
                if budget is not None:
                    data = data[:budget]
                    budget -= len(data)
                dst.sendall(data)
                if budget is not None and budget <= 0:
                    die()
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    while not dead.is_set():
        try:
            c, _ = listener.accept()
        except OSError:
            break
        u = socket.create_connection(("127.0.0.1", int(target)))
        with lock:
            conns.extend([c, u])
        threading.Thread(target=pump, args=(c, u, True), daemon=True).start()
        threading.Thread(target=pump, args=(u, c, False), daemon=True).start()
    time.sleep(1)

def enable_auth(endpoint):
    """An IAM user allowed s3:*, then moto checks every signature."""
    kw = dict(endpoint_url=endpoint, region_name="us-east-1",
              aws_access_key_id="testing", aws_secret_access_key="testing")
    iam = boto3.client("iam", **kw)
    iam.create_user(UserName="trainer")
    iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="trainer")["AccessKey"]
    urllib.request.urlopen(urllib.request.Request(
        endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
        headers={"Content-Type": "text/plain"})).read()
    print(key["AccessKeyId"], key["SecretAccessKey"])

def sigcheck(port_file, done_file):
    """Answer like S3 and recompute each request's SigV4 signature with
    botocore (what AWS does); print the number of mismatches at the end."""
    import http.server, os
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    results = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            auth = self.headers["Authorization"]
            signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
            headers = {k: v for k, v in self.headers.items() if k.lower() in signed}
            req = AWSRequest(method=self.command, url="http://" + self.headers["Host"] + self.path,
                             data=body, headers=headers)
            req.context["timestamp"] = self.headers["X-Amz-Date"]
            signer = S3SigV4Auth(creds, "s3", "us-east-1")
            expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
            results.append((expected == auth.split("Signature=")[1], self.command, self.path))
            status, out = 200, b""
            if self.command == "HEAD":
                status = 404
            elif self.command == "GET" and "list-type=2" in self.path:
                out = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
            elif self.command == "GET":
                status, out = 404, b"<Error><Code>NoSuchKey</Code></Error>"
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(out)

        do_GET = do_PUT = do_DELETE = do_HEAD = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with open(port_file, "w") as f:
        f.write(str(server.server_address[1]))
    while not os.path.exists(done_file):
        time.sleep(0.05)
    for ok, method, path in results:
        if not ok:
            print("signature mismatch:", method, path)
    print("%d requests, %d mismatches" % (len(results), sum(not ok for ok, _, _ in results)))

globals()[sys.argv[1]](*sys.argv[2:])
EOF
tool() { "$PYTHON" s3tool.py "$@"; }

# wait until a file exists (a helper wrote its port there)
wait_file() {
  i=0
  while [ ! -s "$1" ]; do
    i=$((i + 1))
    [ $i -lt 200 ] || fail "timed out waiting for $1"
    sleep 0.05
  done
}

port=$(tool free_port)
endpoint="http://127.0.0.1:$port"
"$PYTHON" -m moto.server -H 127.0.0.1 -p "$port" > moto.log 2>&1 &
pids="$pids $!"
tool wait_up "$endpoint" || { cat moto.log >&2; fail "moto did not start"; }
tool make_bucket "$endpoint" ckpt
AWS_ACCESS_KEY_ID=testing
AWS_SECRET_ACCESS_KEY=testing
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
# the recipes below name this endpoint; the user confirms it here, outside them
TRAINRUN_S3_ENDPOINT=$endpoint
export TRAINRUN_S3_ENDPOINT
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3

recipe() { # recipe FILE DIM PREFIX
  cat > "$1" << EOF
return {
  model = gpt { vocab = 64, ctx = 16, layers = 1, heads = 2, dim = $2 },
  data = { plugin = "synthetic", kind = "tokens", classes = 64 },
  train = { steps = 20, batch = 4, log_every = 5 },
  checkpoint = { plugin = "s3", bucket = "ckpt", endpoint = "$endpoint", prefix = "$3",
                 every = 5, timeout = 10, retries = 1 },
}
EOF
}

# ---- a) save to the bucket while a watcher checks LATEST against its objects
recipe small.lua 32 t/
tool watch "$endpoint" ckpt t/ stop-watch > watch.out 2>&1 &
watcher=$!
wait_file stop-watch.ready
"$TRAINRUN" small.lua run_dir=a checkpoint.keep=10 checkpoint.background=true --quiet > a.log 2>&1 || { cat a.log >&2; fail "training with s3 checkpoints failed"; }
touch stop-watch
wait $watcher || { cat watch.out >&2; fail "LATEST was ahead of its objects during the run"; }
latest=$(tool check_cmd "$endpoint" ckpt t/) || fail "the bucket is inconsistent after the run"
[ "$latest" = step-0000000020 ] || fail "LATEST is '$latest', expected step-0000000020"
[ "$(tool manifests "$endpoint" ckpt t/)" = "step-0000000005 step-0000000010 step-0000000015 step-0000000020" ] ||
  fail "checkpoints in the bucket: $(tool manifests "$endpoint" ckpt t/)"
grep -q "uploaded step-0000000020" a.log || { cat a.log >&2; fail "no upload report in the log"; }
[ -z "$(ls -A a/s3-staging)" ] || fail "staged copies left behind: $(ls -A a/s3-staging)"
echo "s3: a) 4 checkpoints uploaded in the background, LATEST checked $(cat watch.out) times during the run"

# ---- b) resume from the bucket alone, in a new run directory
"$TRAINRUN" small.lua run_dir=b train.steps=30 --resume auto --quiet > b.log 2>&1 ||
  { cat b.log >&2; fail "resuming from the bucket failed"; }
grep -q "resumed from checkpoint step-0000000020" b.log || { cat b.log >&2; fail "did not resume from the bucket"; }
latest=$(tool check_cmd "$endpoint" ckpt t/)
[ "$latest" = step-0000000030 ] || fail "LATEST is '$latest' after resuming, expected step-0000000030"
# keep = 3 (the default) counts finished uploads: pruning right after a
# commit may or may not see that checkpoint's upload done, so step 15 may stay
case "$(tool manifests "$endpoint" ckpt t/)" in
  "step-0000000020 step-0000000025 step-0000000030" | \
  "step-0000000015 step-0000000020 step-0000000025 step-0000000030") ;;
  *) fail "after pruning to 3: $(tool manifests "$endpoint" ckpt t/)" ;;
esac
echo "s3: b) resumed from the bucket in a new run directory, old checkpoints pruned"

# ---- f) a sharded checkpoint (parallel.shard): each rank uploads its blob,
# rank 0's MANIFEST names them all; read back range by range at 1 and 3 ranks
recipe sharded.lua 32 sh/
sharded="train.batch=12 train.micro_batch=1 train.threads=1 parallel.bucket_mb=0.01"
# shellcheck disable=SC2086
"$TRAINRUN" sharded.lua run_dir=f procs=2 parallel.shard=parameters $sharded > f.log 2>&1 ||
  { cat f.log >&2; fail "a sharded run saving to the bucket failed"; }
grep -q "cannot take one checkpoint from several ranks" f.log && { cat f.log >&2; fail "s3 fell back on rank 0 writing"; }
latest=$(tool check_cmd "$endpoint" ckpt sh/) || fail "the bucket is inconsistent after a sharded run"
[ "$latest" = step-0000000020 ] || fail "sharded: LATEST is '$latest'"
"$PYTHON" - "$endpoint" << 'PY' || fail "sharded: the MANIFEST does not name every rank's blob, or parts were left"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
m = s3.get_object(Bucket="ckpt", Key="sh/step-0000000020/MANIFEST")["Body"].read().decode()
for blob in ("shard-00000-of-00002.bin", "shard-00001-of-00002.bin", "layout.json", "state.json"):
    assert any(line.split(" ")[-1] == blob for line in m.splitlines()[1:]), (blob, m)
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="sh/").get("Contents", [])]
assert not any("/PART-" in k for k in keys), keys
PY
# at 3 ranks from step 20 (saved at 2) to 25, then in one process from 25 (saved at 3)
for case in 3:20:25 1:25:30; do
  procs=${case%%:*} rest=${case#*:}
  from=${rest%%:*} to=${rest#*:}
  # shellcheck disable=SC2086
  "$TRAINRUN" sharded.lua run_dir=f$procs procs=$procs parallel.shard=parameters $sharded \
    train.steps=$to --resume auto --allow-changes > f$procs.log 2>&1 ||
    { cat f$procs.log >&2; fail "resuming a sharded checkpoint from the bucket at $procs ranks"; }
  grep -q "resumed from checkpoint step-00000000$from" f$procs.log ||
    { cat f$procs.log >&2; fail "sharded: no resume from step $from in the bucket at $procs ranks"; }
done
grep -q "every rank read its own parts" f3.log || { cat f3.log >&2; fail "sharded: the 3 ranks did not read their parts"; }
echo "s3: f) sharded checkpoints: saved at 2 ranks, resumed from the bucket at 3, saved there, resumed in 1 process"

# ---- c) the server dies during the upload of step 10's second blob
recipe big.lua 128 f/
# die_during PREFIX RUN_DIR LOG [trainrun args]: a proxy in front of moto dies
# 300 kB into the upload of step 10's optimizer; sets $code and $proxy_port
die_during() {
  prefix=$1 dir=$2 log=$3
  shift 3
  rm -f proxy.port
  tool proxy proxy.port "$port" "PUT /ckpt/${prefix}step-0000000010/optimizer.safetensors" 300000 > proxy.log 2>&1 &
  pids="$pids $!"
  wait_file proxy.port
  proxy_port=$(cat proxy.port)
  rm -f stop-watch stop-watch.ready
  tool watch "$endpoint" ckpt "$prefix" stop-watch > watch.out 2>&1 &
  watcher=$!
  wait_file stop-watch.ready
  set +e
  TRAINRUN_S3_ENDPOINT="http://127.0.0.1:$proxy_port" "$TRAINRUN" big.lua run_dir="$dir" \
    checkpoint.prefix="$prefix" checkpoint.endpoint="http://127.0.0.1:$proxy_port" "$@" --quiet > "$log" 2>&1
  code=$?
  set -e
  touch stop-watch
  wait $watcher || { cat watch.out >&2; fail "LATEST was ahead of its objects while the server died"; }
  grep -q "PUT s3://ckpt/${prefix}step-0000000010/optimizer.safetensors at http://127.0.0.1:$proxy_port failed" "$log" ||
    { cat "$log" >&2; fail "the failed upload of step 10 is not reported with its object and endpoint"; }
  latest=$(tool check_cmd "$endpoint" ckpt "$prefix") || fail "the bucket is inconsistent after the server died"
  [ "$latest" = step-0000000005 ] || fail "LATEST is '$latest' after the server died, expected step-0000000005"
  [ "$(tool manifests "$endpoint" ckpt "$prefix")" = step-0000000005 ] ||
    fail "complete checkpoints after the server died: $(tool manifests "$endpoint" ckpt "$prefix")"
}

# uploads inside commit (the default): the core hears of every failure
die_during f/ c c.log
[ $code -ne 0 ] || { cat c.log >&2; fail "the last checkpoint did not land, yet the run exited 0"; }
grep -q "checkpoint step-0000000010 not saved" c.log || { cat c.log >&2; fail "the core did not report step 10"; }
"$TRAINRUN" big.lua run_dir=c2 checkpoint.prefix=f/ train.steps=10 --resume auto --quiet > c2.log 2>&1 ||
  { cat c2.log >&2; fail "resuming after the server died failed"; }
grep -q "resumed from checkpoint step-0000000005" c2.log || { cat c2.log >&2; fail "did not resume from step 5"; }
echo "s3: c) server died mid-upload: LATEST stayed on step-0000000005, the run failed saying why"

# background = true: failures are logged, the last staged copy is kept...
die_during g/ g g.log checkpoint.background=true
[ $code -eq 0 ] || { cat g.log >&2; fail "exit code $code: a failed background upload should not stop training"; }
grep -q "step-0000000010 was not uploaded, so LATEST still names an older checkpoint" g.log ||
  { cat g.log >&2; fail "the failed background upload of step 10 was not reported"; }
ls -A g/s3-staging | grep -q "step-0000000020" ||
  { cat g.log >&2; fail "the last checkpoint's staged copy was not kept: $(ls -A g/s3-staging)"; }
# ...and the next run in the same directory uploads it, then resumes from it
"$TRAINRUN" big.lua run_dir=g checkpoint.prefix=g/ train.steps=25 --resume auto --quiet > g2.log 2>&1 ||
  { cat g2.log >&2; fail "the run after the failure failed"; }
grep -q "uploading step-0000000020, staged in" g2.log || { cat g2.log >&2; fail "the staged copy was not uploaded"; }
grep -q "resumed from checkpoint step-0000000020" g2.log || { cat g2.log >&2; fail "did not resume from the recovered upload"; }
latest=$(tool check_cmd "$endpoint" ckpt g/)
[ "$latest" = step-0000000025 ] || fail "LATEST is '$latest' after recovery, expected step-0000000025"
echo "s3: c) background uploads: the same, logged; the next run uploaded the staged copy and resumed from it"

# ---- d) signatures
# botocore recomputes every signature, for a prefix that needs escaping
tool sigcheck sig.port sig.done > sig.out 2>&1 &
sigpid=$!
pids="$pids $sigpid"
wait_file sig.port
TRAINRUN_S3_ENDPOINT="http://127.0.0.1:$(cat sig.port)" "$TRAINRUN" small.lua run_dir=d1 train.steps=5 \
  checkpoint.endpoint="http://127.0.0.1:$(cat sig.port)" 'checkpoint.prefix=runs/exp 1+x=y/' --quiet > d1.log 2>&1 || { cat d1.log >&2; fail "run against the signature checker failed"; }
touch sig.done
wait $sigpid
grep -q " 0 mismatches" sig.out || { cat sig.out >&2; fail "signatures differ from botocore's"; }
# moto with authentication on: the right keys work, a wrong secret is refused clearly
# (a prefix without '/': moto mis-verifies '%2F' in query strings)
keys=$(tool enable_auth "$endpoint")
AWS_ACCESS_KEY_ID=${keys% *}
AWS_SECRET_ACCESS_KEY=${keys#* }
"$TRAINRUN" small.lua run_dir=d2 train.steps=10 checkpoint.prefix=signed- checkpoint.keep=10 --quiet > d2.log 2>&1 ||
  { cat d2.log >&2; fail "signed requests were refused"; }
grep -q "uploaded step-0000000010" d2.log || { cat d2.log >&2; fail "no upload with authentication on"; }
set +e
AWS_SECRET_ACCESS_KEY=wrong "$TRAINRUN" small.lua run_dir=d3 checkpoint.prefix=signed- --quiet > d3.log 2>&1
code=$?
set -e
[ $code -ne 0 ] || fail "a wrong secret key was accepted"
grep -q "SignatureDoesNotMatch.*AWS_SECRET_ACCESS_KEY" d3.log || { cat d3.log >&2; fail "a wrong secret key is not explained"; }
echo "s3: d) $(tail -n 1 sig.out) against botocore; moto checked signatures"

# ---- e) credentials
# from a profile of a shared credentials file, as the AWS CLI writes it
cat > credentials << EOF
[default]
aws_access_key_id = wrong
aws_secret_access_key = wrong

[trainer]
aws_access_key_id = $AWS_ACCESS_KEY_ID
aws_secret_access_key = $AWS_SECRET_ACCESS_KEY
EOF
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_SHARED_CREDENTIALS_FILE="$work/credentials" \
  AWS_PROFILE=trainer "$TRAINRUN" small.lua run_dir=e1 train.steps=5 checkpoint.prefix=profile- \
  --quiet > e1.log 2>&1 || { cat e1.log >&2; fail "credentials from a profile of the credentials file"; }
grep -q "uploaded step-0000000005" e1.log || { cat e1.log >&2; fail "no upload with the profile's keys"; }
# a recipe's own endpoint gets nothing (a listener records what reaches it),
# nor does an old recipe that names a variable as its "secret"
rm -f sig.port sig.done
tool sigcheck sig.port sig.done > sig.out 2>&1 &
sigpid=$!
pids="$pids $sigpid"
wait_file sig.port
sed "s|endpoint = \"$endpoint\"|endpoint = \"http://127.0.0.1:$(cat sig.port)\"|" small.lua > elsewhere.lua
grep -q "127.0.0.1:$(cat sig.port)" elsewhere.lua || fail "elsewhere.lua names no other endpoint"
sed "s|retries = 1|retries = 1, secret_key_env = \"SOME_TOKEN\"|" small.lua > oldkeys.lua
grep -q "secret_key_env" oldkeys.lua || fail "oldkeys.lua names no variable"
set +e
env -u TRAINRUN_S3_ENDPOINT SOME_TOKEN=not-for-s3 "$TRAINRUN" elsewhere.lua run_dir=e2 train.steps=5 --quiet > e2.log 2>&1
e2=$?
SOME_TOKEN=not-for-s3 "$TRAINRUN" oldkeys.lua run_dir=e3 train.steps=5 --quiet > e3.log 2>&1
e3=$?
set -e
touch sig.done
wait $sigpid
[ $e2 -ne 0 ] || { cat e2.log >&2; fail "a run against an endpoint only the recipe named went ahead"; }
grep -q "which is not AWS's S3.*TRAINRUN_S3_ENDPOINT" e2.log || { cat e2.log >&2; fail "the refused endpoint is not explained"; }
grep -q "^0 requests" sig.out || { cat sig.out >&2; fail "requests reached an endpoint only the recipe named"; }
[ $e3 -ne 0 ] || { cat e3.log >&2; fail "checkpoint.secret_key_env was accepted"; }
grep -q "checkpoint.secret_key_env was removed.*AWS_ACCESS_KEY_ID" e3.log || { cat e3.log >&2; fail "the removed option is not explained"; }
echo "s3: e) credentials from a profile; none sent to an endpoint only the recipe named"
echo "s3: ok"
