#!/bin/sh
# moto's S3 server for docker/compose.yaml on $S3_HOST:$S3_PORT (127.0.0.1:9000), with the bucket $S3_BUCKET (videos)
# made once it answers: `telefuser serve --artifacts s3://...` refuses to start without its bucket.
set -eu
host=${S3_HOST:-127.0.0.1} port=${S3_PORT:-9000}
/opt/moto/bin/python -m moto.server -H "$host" -p "$port" &
server=$!
trap 'kill $server' INT TERM
S3_URL="http://$host:$port" /opt/moto/bin/python - <<'PY'
import os, time
import boto3, botocore.exceptions
region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
s3 = boto3.client("s3", endpoint_url=os.environ["S3_URL"], region_name=region)
for _ in range(300):
    try:
        s3.create_bucket(Bucket=os.environ.get("S3_BUCKET", "videos"))
        break
    except botocore.exceptions.EndpointConnectionError:
        time.sleep(0.1)
else:
    raise SystemExit("moto's S3 server did not answer within 30 s")
print("bucket", os.environ.get("S3_BUCKET", "videos"), "ready at", os.environ["S3_URL"], flush=True)
PY
wait $server
