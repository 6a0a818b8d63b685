# syntax=docker/dockerfile:1
#
# One image with both binaries: /manager (the entrypoint, the operator) and
# /cache-server (run by the fleets the operator creates; the operator's
# RELATED_IMAGE_CACHE_SERVER points at this same image).
#
# Reproducible: pinned toolchain and base images, modules from go.sum,
# static binaries built with -trimpath, no VCS stamping and an empty build
# id, so the same sources give the same bytes.
#
#   docker build -t ghcr.io/cachetier/cachetier:0.1.0 .
#
# Without a container engine, `make image` builds the same image
# (hack/imagebuild; its tests keep it and this file in agreement).

ARG GO_IMAGE=docker.io/library/golang:1.26.8-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# Dependencies first, so source edits do not invalidate the module cache layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# The same target CI uses; GOFLAGS adds what makes the output reproducible.
ENV GOOS=${TARGETOS} GOARCH=${TARGETARCH} CGO_ENABLED=0 \
    GOFLAGS="-buildvcs=false -ldflags=-buildid="
RUN --mount=type=cache,target=/root/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    make build BIN=/out && \
    test -x /out/manager && test -x /out/cache-server

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.source="https://github.com/cachetier/cachetier" \
      org.opencontainers.image.description="cachetier operator and cache-server" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/manager /manager
COPY --from=build /out/cache-server /cache-server
# distroless "nonroot": uid/gid 65532, no shell, no package manager.
USER 65532:65532
ENTRYPOINT ["/manager"]
