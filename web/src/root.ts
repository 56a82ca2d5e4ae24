/**
 * Where the inspector and its server are, read from this script's own address, so the page also
 * works behind a reverse proxy that serves Engram under a path prefix (`/engram/inspector/…` for
 * the server's `/inspector/…`). The build puts every script in `assets/`, one level below the
 * inspector's root, as the dev server does with `src/`.
 */
export const INSPECTOR_ROOT = new URL(/* @vite-ignore */ "../", import.meta.url);

/** The server's root: `graphql` and `export/…` are below it. */
export const SERVER_ROOT = new URL("../", INSPECTOR_ROOT);
