# A GPU worker's image: Ray, the pinned torch and torchvision and this project, so a new spot
# node runs a trial at once instead of installing several GB first (cluster.yaml's
# docker.worker_image, docs/CLUSTER.md). The pins are the Makefile's (tests/test_torch_pins.py).
# TORCH_CUDA picks torch's build, one of tools/torch_builds.txt, as the Makefile's variable
# does; give it the value of the GPU workers' --env TORCH_CUDA in cluster.yaml (their setup
# otherwise installs that build over this one): cu130 (NVIDIA driver >= 580) by default,
#   docker build --build-arg TORCH_CUDA=cu126 ...   # CUDA 12.6: driver >= 525, also V100/P100
# Another value stops the build with one error line before it installs anything.
# Untested: no Docker engine was at hand where this was written.
FROM rayproject/ray:2.58.1-py311-gpu
ARG TORCH_CUDA=cu130
COPY tools/torch_build.sh tools/torch_builds.txt /tmp/torch-builds/
RUN sh /tmp/torch-builds/torch_build.sh "$TORCH_CUDA" \
    && pip install --no-cache-dir torch==2.14.1+${TORCH_CUDA} torchvision==0.29.1+${TORCH_CUDA} \
        --index-url https://download.pytorch.org/whl/${TORCH_CUDA}
COPY --chown=ray:users . /home/ray/unbiased-mi
RUN pip install --no-cache-dir -e /home/ray/unbiased-mi torch==2.14.1+${TORCH_CUDA} torchvision==0.29.1+${TORCH_CUDA}
