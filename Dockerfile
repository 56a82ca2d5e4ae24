# Engram's API and job worker, on PostgreSQL (DATABASE_URL); see docker-compose.yml.
FROM node:20-bookworm-slim

WORKDIR /app
# Installed and run as the unprivileged `node` user; owning /app avoids a chown layer later.
RUN chown node:node /app
USER node

# Dependencies first, so source edits do not reinstall them. npm ci runs the postinstall
# (`prisma generate`, offline), which needs the Prisma schema, its config and the script.
COPY --chown=node:node package.json package-lock.json prisma.config.ts ./
COPY --chown=node:node scripts/generate.mjs scripts/generate.mjs
COPY --chown=node:node prisma prisma
RUN npm ci && npm cache clean --force

COPY --chown=node:node . .

# Set after npm ci: with NODE_ENV=production it would skip devDependencies.
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=4000

EXPOSE 4000
CMD ["npm", "start"]
