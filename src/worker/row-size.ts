/**
 * The payload bytes of a row, as recent fetches brought them: up at once, down slowly, so a fetch after a
 * few large rows does not ask for a batch of small-row size. Unknown before the first fetch.
 */
export class RowSize {
  #bytes: number | undefined;

  /** A fetch brought `bytes` of payload in `rows` rows. */
  learn(rows: number, bytes: number): void {
    if (rows === 0) return;
    const mean = bytes / rows;
    this.#bytes = this.#bytes === undefined ? mean : Math.max(mean, this.#bytes * 0.8 + mean * 0.2);
  }

  /** Rows of the recent size that fit in `budget` bytes; undefined while the size is unknown. */
  rowsIn(budget: number): number | undefined {
    return this.#bytes === undefined ? undefined : Math.floor(budget / this.#bytes);
  }
}
