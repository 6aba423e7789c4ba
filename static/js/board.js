// The live Connect Four board: drawn from the board text of the latest game.move
// (header "0 1 2 3 4 5 6", then six rows top to bottom of ".", "X" first player, "O" second player).

export const WIDTH = 7;
export const HEIGHT = 6;

/** The six rows (top first) of seven cells ('.', 'X' or 'O') in a board text; null if it is not one. */
export function parseBoard(text) {
  const rows = String(text || "")
    .split("\n")
    .map((line) => line.trim().split(/\s+/))
    .filter((cells) => cells.length === WIDTH && cells.every((c) => c === "." || c === "X" || c === "O"));
  return rows.length === HEIGHT ? rows : null;
}

export class ConnectFourBoard {
  /** root: the #board element; caption/agentText: where the move and the agent's answer are written. */
  constructor(root, { caption, agentText, result }) {
    this.root = root;
    this.caption = caption;
    this.agentText = agentText;
    this.result = result;
    this.cells = [];
    this.game = null;
    root.replaceChildren();
    for (let i = 0; i < WIDTH * HEIGHT; i += 1) {
      const cell = document.createElement("div");
      cell.className = "cell";
      this.cells.push(cell);
      root.append(cell);
    }
    root.dataset.ply = "0";
  }

  /** Show one game.move's data (only the latest of a batch is worth drawing). */
  showMove(move) {
    const rows = parseBoard(move.board);
    if (!rows) return;
    const game = `${move.iteration}/${move.game}`;
    if (game !== this.game) {
      this.game = game;
      this.result.textContent = "";
      this.result.className = "result";
    }
    let stones = 0;
    // The last stone dropped is the top one of the column just played.
    const lastRow = move.column === null ? -1 : rows.findIndex((r) => r[move.column] !== ".");
    rows.forEach((row, r) => row.forEach((c, col) => {
      const cell = this.cells[r * WIDTH + col];
      cell.className = "cell" + (c === "X" ? " x" : c === "O" ? " o" : "");
      if (r === lastRow && col === move.column) cell.classList.add("last");
      if (c !== ".") stones += 1;
    }));
    this.root.dataset.ply = String(stones);
    this.root.dataset.game = game;
    const column = move.column === null ? "an invalid answer" : `column ${move.column}`;
    this.caption.textContent = `Iteration ${move.iteration}, game ${move.game}, ply ${move.ply}: ` +
      `${move.player} played ${column} · context ${move.context_tokens} tokens`;
    if (move.player === "agent") this.agentText.textContent = move.text || "(empty answer)";
  }

  /** Show a game.end's result if it belongs to the game on the board. */
  showEnd(end) {
    if (`${end.iteration}/${end.game}` !== this.game) return;
    const side = end.agent_side === 1 ? "X, first" : "O, second";
    this.result.textContent = `Agent (${side}) ${end.result} vs ${end.opponent}, reward ${Number(end.reward).toFixed(2)}`;
    this.result.className = `result ${end.result}`;
  }
}
