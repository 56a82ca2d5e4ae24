# Engram's API and job worker, on PostgreSQL (DATABASE_URL); see docker-compose.yml.
# .ci/run replays these steps in a clean folder (no Docker daemon there): keep them plain
# WORKDIR / COPY / RUN / ENV / USER / EXPOSE / HEALTHCHECK / CMD lines.
FROM node:20-bookworm-slim

WORKDIR /app
# Installed and run as the unprivileged `node` user; owning /app avoids a chown layer later.
RUN chown node:node .
USER node

# Dependencies first, so source edits do not reinstall them. Our own postinstall (generate the
# Prisma client, compile, build the inspector) needs the sources: it runs after they are copied.
COPY --chown=node:node package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund && npm cache clean --force

COPY --chown=node:node . .
RUN npm run postinstall && npm prune --omit=dev --ignore-scripts --no-audit --no-fund
# The embedded store's folder (ENGRAM_DATA_DIR's default, used without DATABASE_URL), made here so
# that a new volume mounted on it (`-v engram-data:/app/.engram`) starts out owned by `node`:
# Docker creates a volume for a path the image lacks as root's, which `node` cannot write.
RUN mkdir -m 700 .engram

# Two malloc arenas per process, not eight per core: the same memory trade (README, "Under a
# supervisor").
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=4000 \
    MALLOC_ARENA_MAX=2

EXPOSE 4000
# Health for a plain `docker run` too (compose's healthcheck is the same): /readyz answers 200
# once listening with the store and queue answering, 503 while shutting down. The slim image has
# no curl: Node's fetch asks, on the port the server listens on.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 4000) + '/readyz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# node itself, no npm or shell in between: SIGTERM from the runtime reaches the server. The V8
# flags trade memory only: the heap grows by half its live size between full collections, not
# several times it, and the young generation's halves stay at 4 MB (README, "Under a supervisor").
CMD ["node", "--heap-growing-percent=50", "--max-semi-space-size=4", "dist/main.js"]
