# Both images from one build: `docker build --target proxy -t cftunnel-proxy .` and
# `docker build --target controller -t cftunnel-controller .`
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p cftunnel-proxy -p cftunnel-controller

# The proxy: standalone on :8080, or the tunnel's connector with TUNNEL_TOKEN; config API,
# health and metrics on :8081. Runs as an unprivileged numeric user (65532), which the chart's
# and the rendered pods' runAsNonRoot checks (they name no UID, so OpenShift may assign its
# own), and writes nothing to its file system.
FROM gcr.io/distroless/cc-debian12:nonroot AS proxy
COPY --from=build /src/target/release/cftunnel-proxy /usr/local/bin/cftunnel-proxy
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/cftunnel-proxy"]

FROM gcr.io/distroless/cc-debian12:nonroot AS controller
COPY --from=build /src/target/release/cftunnel-controller /usr/local/bin/cftunnel-controller
USER 65532:65532
EXPOSE 8082
ENTRYPOINT ["/usr/local/bin/cftunnel-controller"]
CMD ["run"]
