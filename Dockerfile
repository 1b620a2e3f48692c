# Build the CLI, then run it on a slim image as a non-root user.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --omit=optional
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
# No embedded Postgres in the image: a container is given DATABASE_URL (without it, `run` exits 2 saying so).
RUN npm ci --no-audit --no-fund --omit=dev --omit=optional && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY examples ./examples
USER node
# /healthz, /readyz and /metrics; `run` serves them on this port, and the healthcheck asks it. Outside a
# container the server binds 127.0.0.1 by default; here the container's network is the boundary, and a
# published port or a probe reaches only an address bound on every interface.
ENV OUTBOX_HTTP_PORT=9464
ENV OUTBOX_HTTP_HOST=0.0.0.0
EXPOSE 9464
# The healthcheck asks /readyz on 127.0.0.1 (no curl or wget in the image) with a 3 s wait: healthy while
# the worker runs and reaches its database (see the README, "Docker"). A file of its own, not the CLI's
# `healthcheck`, whose module graph made it 2.5 times slower to start, past the old 5 s timeout on a loaded
# host. 10 s covers a slow Node start plus the 3 s wait. Services of this image that run something else
# (migrate, a producer) turn it off.
COPY deploy/docker/healthcheck.cjs ./healthcheck.cjs
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 \
  CMD ["node", "healthcheck.cjs"]
# node itself as PID 1, never npm or npx: `docker stop`'s SIGTERM must reach the worker (README: Signals).
ENTRYPOINT ["node", "dist/cli/main.js"]
CMD ["run", "--handlers", "examples/handlers.js"]
