# Custom Dataflow worker container: the Beam SDK image of the same Beam version as
# setup.py pins (2.77.0), with this package installed. Use it with
#   --sdk_container_image=REGION-docker.pkg.dev/PROJECT/REPO/beam-tfrecords:TAG
# The base image's entrypoint, /opt/apache/beam/boot, is kept as is.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/beam-tfrecords
COPY setup.py README.md ./
COPY beam_pipeline ./beam_pipeline
COPY transforms ./transforms
COPY schemas ./schemas
RUN pip install --no-cache-dir .

ENTRYPOINT ["/opt/apache/beam/boot"]
