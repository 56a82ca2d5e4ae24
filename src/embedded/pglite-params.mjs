// What every PGlite process of the embedded store starts with. Plain JS, like its children.
import { PGlite } from "@electric-sql/pglite";

// PostgreSQL's default 128 MB of shared buffers stays resident in the WASM heap once touched.
// 32 MB, on a copy of a LoCoMo-sized store (127 MB on disk) over 1,500 recall searches: 251 MB
// resident instead of 370, p50 9.95 ms instead of 9.37, p95 the same (bench/README.md, "Memory
// footprint"). The pages it no longer keeps stay in the operating system's file cache. Creating a
// folder with initdb takes the same buffers: its peak went from 887 to 795 MB with them.
export const START_OPTIONS = { startParams: [...PGlite.defaultStartParams, "-c", "shared_buffers=32MB"] };
