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
# No embedded Postgres in the image: a container is given DATABASE_URL.
RUN npm ci --no-audit --no-fund --omit=dev --omit=optional && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY examples ./examples
USER node
EXPOSE 9464
ENTRYPOINT ["node", "dist/cli/main.js"]
CMD ["run", "--handlers", "examples/handlers.js", "--http-port", "9464"]
