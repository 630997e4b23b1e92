"""Who beats whom: win rates between the policies of a multi-policy run, from two-player matches.

    rates = WinRates(num_policies=3)
    rates.add(((0, 2), (1.0, -1.0)))      # a Match (sf_core.contracts.signals): agents' policies, agents' returns
    rates.matrix()[0][2]                   # 1.0: policy 0 won its one game against policy 2
    rates.mean_win_rate(0)                 # the PBT objective "win_rate"

A match's winner is the agent with the higher return; equal returns are a tie, half a win for each.
Only matches of exactly two agents count (a game of three has no pairwise winner). A policy that
plays itself fills the diagonal: both agents are its games, one won and one lost (or two ties), so
the diagonal stays at 0.5 and only says how much self-play there was. Each pair keeps its last
`window` matches, so the rates follow policies that are still learning.
"""

from __future__ import annotations

from collections import deque

from sf_core.contracts.signals import Match


class WinRates:
    def __init__(self, num_policies: int, window: int = 200):
        if num_policies < 1 or window < 1:
            raise ValueError(f"WinRates needs num_policies >= 1 and window >= 1, got {num_policies}, {window}")
        self.num_policies, self.window = num_policies, window
        # per unordered pair (i <= j): recent scores of policy i against j (1 win, 0.5 tie, 0 loss); j's
        # scores are 1 - those, so one queue serves both directions and they always agree
        self._scores: dict[tuple[int, int], deque[float]] = {}

    def add(self, match: Match) -> None:
        """Count one finished match; ignored unless it has exactly two agents."""
        policies, returns = match
        if len(policies) != 2 or len(returns) != 2:
            return
        (a, b), (ra, rb) = policies, returns
        for p in (a, b):
            if not 0 <= p < self.num_policies:
                raise ValueError(f"match {match} names policy {p}, outside 0..{self.num_policies - 1}")
        score_a = 1.0 if ra > rb else 0.0 if ra < rb else 0.5
        if a > b:
            a, b, score_a = b, a, 1.0 - score_a
        queue = self._scores.setdefault((a, b), deque(maxlen=self.window))
        queue.append(score_a)

    def forget(self, policy: int) -> None:
        """Drop every match `policy` played (PBT replaced its weights: those games were another player's)."""
        for pair in [pair for pair in self._scores if policy in pair]:
            del self._scores[pair]

    def _pair(self, row: int, col: int) -> tuple[float, int]:
        """(summed score of `row` against `col`, games) over the window."""
        if row <= col:
            queue = self._scores.get((row, col), ())
            return sum(queue), len(queue)
        queue = self._scores.get((col, row), ())
        return len(queue) - sum(queue), len(queue)

    def games(self) -> list[list[int]]:
        """Matches in the window between each pair (symmetric; a policy against itself on the diagonal)."""
        return [[self._pair(i, j)[1] for j in range(self.num_policies)] for i in range(self.num_policies)]

    def matrix(self) -> list[list[float | None]]:
        """Row policy's win rate against the column policy (ties half), None where they have not met.
        A cell and its mirror add up to 1; the diagonal is 0.5 where a policy played itself."""
        rows: list[list[float | None]] = []
        for i in range(self.num_policies):
            row: list[float | None] = []
            for j in range(self.num_policies):
                score, n = self._pair(i, j)
                # a policy against itself: each match is one of its wins and one of its losses
                row.append(None if n == 0 else 0.5 if i == j else score / n)
            rows.append(row)
        return rows

    def mean_win_rate(self, policy: int) -> float | None:
        """Mean of `policy`'s row over the other policies it has played: the PBT objective "win_rate".
        None before it has met any other policy."""
        rates = [rate for j, rate in enumerate(self.matrix()[policy]) if j != policy and rate is not None]
        return sum(rates) / len(rates) if rates else None

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars: `policy_{i}/win_rate/vs_{j}` for every pair that has met, and
        `policy_{i}/win_rate/mean` (its mean_win_rate) where defined."""
        out: dict[str, float] = {}
        for i, row in enumerate(self.matrix()):
            out.update({f"policy_{i}/win_rate/vs_{j}": rate for j, rate in enumerate(row) if rate is not None})
            mean = self.mean_win_rate(i)
            if mean is not None:
                out[f"policy_{i}/win_rate/mean"] = mean
        return out

    def console_lines(self) -> list[str]:
        """The matrix for the console summary: rows win against columns, in percent, with the games
        in the window; '-' where a pair has not met."""
        n = self.num_policies
        games = self.games()
        header = "win rate (row vs column)  " + " ".join(f"{f'p{j}':>6}" for j in range(n)) + "    mean  games"
        lines = [header]
        for i, row in enumerate(self.matrix()):
            cells = " ".join(f"{'-' if rate is None else f'{100 * rate:.0f}%':>6}" for rate in row)
            mean = self.mean_win_rate(i)
            mean_text = "-" if mean is None else f"{100 * mean:.0f}%"
            lines.append(f"{f'p{i}':<26}{cells}  {mean_text:>6}  {sum(games[i]):>5}")
        return lines
