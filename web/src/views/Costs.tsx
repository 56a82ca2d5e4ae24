import { InspectorUsageDocument, JobRunsDocument } from "@gql/graphql.ts";
import { useMemo, useState } from "react";
import { Empty, Failure, Loading, StackedBars, time } from "../components.tsx";
import { useQuery } from "../hooks.ts";

const DAY = 24 * 60 * 60 * 1000;
const usd = (v: number | null | undefined) => (v == null ? "–" : `$${v.toFixed(4)}`);

export function CostsView() {
  const [days, setDays] = useState(14);
  // Whole UTC days, so the window does not move on every render.
  const from = useMemo(() => new Date(Math.floor(Date.now() / DAY) * DAY - (days - 1) * DAY).toISOString(), [days]);
  const usage = useQuery(InspectorUsageDocument, { from, to: null });
  const jobs = useQuery(JobRunsDocument, { name: null, first: 20 });

  const chart = useMemo(() => {
    const rows = usage.data?.byDay.rows ?? [];
    const purposes = [...new Set(rows.map((r) => r.purpose ?? "?"))].sort();
    const labels = Array.from({ length: days }, (_, i) => new Date(Date.parse(from) + i * DAY).toISOString().slice(0, 10));
    const values = labels.map((day) =>
      purposes.map((p) =>
        rows.filter((r) => r.day === day && (r.purpose ?? "?") === p).reduce((sum, r) => sum + r.inputTokens + r.outputTokens, 0),
      ),
    );
    return { purposes, labels: labels.map((d) => d.slice(5)), values };
  }, [usage.data, days, from]);

  const summary = usage.data?.byChain;
  const budget = usage.data?.budgetStatus;
  return (
    <section aria-labelledby="costs-title">
      <h1 id="costs-title">Costs & jobs</h1>
      <form className="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          Period
          <select value={days} onChange={(e) => setDays(Number(e.target.value))}>
            <option value={7}>last 7 days</option>
            <option value={14}>last 14 days</option>
            <option value={30}>last 30 days</option>
          </select>
        </label>
      </form>
      {usage.error && <Failure error={usage.error} retry={usage.refetch} />}
      {usage.loading && !usage.data && <Loading />}
      {summary && (
        <>
          <p className="totals">
            <strong>{summary.inputTokens + summary.outputTokens}</strong> tokens ({summary.inputTokens} in, {summary.outputTokens} out) in{" "}
            {summary.calls} calls · cost {usd(summary.costUsd)}
            {summary.unpricedTokens > 0 && ` (+${summary.unpricedTokens} tokens of unpriced models)`} · {summary.redactions} redactions
          </p>
          {budget && (
            <p className={budget.paused ? "failure" : "muted"}>
              Monthly budget: {budget.spent} of {budget.limit ?? "unlimited"} tokens
              {budget.paused && " — background memory work is paused until the period rolls over or the limit is raised"}.
            </p>
          )}
          <h2>Tokens per day, by purpose</h2>
          {chart.purposes.length === 0 ? (
            <Empty>No model calls in this period.</Empty>
          ) : (
            <StackedBars title="Tokens per day by purpose" labels={chart.labels} keys={chart.purposes} values={chart.values} />
          )}
          <h2>By purpose and chain</h2>
          {summary.rows.length === 0 ? (
            <Empty>No model calls in this period.</Empty>
          ) : (
            <table>
              <thead>
                <tr>
                  <th scope="col">Purpose</th>
                  <th scope="col">Chain</th>
                  <th scope="col">Calls</th>
                  <th scope="col">Input</th>
                  <th scope="col">Output</th>
                  <th scope="col">Cost</th>
                </tr>
              </thead>
              <tbody>
                {summary.rows.map((r) => (
                  <tr key={`${r.purpose}:${r.chain}`}>
                    <td>{r.purpose}</td>
                    <td>{r.chain}</td>
                    <td className="num">{r.calls}</td>
                    <td className="num">{r.inputTokens}</td>
                    <td className="num">{r.outputTokens}</td>
                    <td className="num">{usd(r.costUsd)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      )}
      <h2>Recent job runs</h2>
      {jobs.error && <Failure error={jobs.error} retry={jobs.refetch} />}
      {jobs.data && jobs.data.jobRuns.length === 0 && <Empty>No job has run yet. Compaction runs daily at 06:17 UTC.</Empty>}
      {jobs.data && jobs.data.jobRuns.length > 0 && (
        <table>
          <thead>
            <tr>
              <th scope="col">Job</th>
              <th scope="col">Status</th>
              <th scope="col">Started</th>
              <th scope="col">Finished</th>
              <th scope="col">Result</th>
            </tr>
          </thead>
          <tbody>
            {jobs.data.jobRuns.map((run) => (
              <tr key={run.id}>
                <td>
                  <code>{run.name}</code>
                </td>
                <td>{run.status.toLowerCase()}</td>
                <td>{time(run.startedAt)}</td>
                <td>{run.finishedAt ? time(run.finishedAt) : "–"}</td>
                <td>{run.error ?? (run.result != null ? <code>{JSON.stringify(run.result)}</code> : "")}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
