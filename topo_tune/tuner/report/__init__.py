"""``report.html``: one self-contained page a platform team can act on.

Purpose: from ``summary.json``'s data (rendered generically: a field it lacks is left out, a field it gains
shows) and the study's measurements, render

* a summary box: the verdict, the chosen settings and rank order, the weighted speedup with its CI, and the
  commands that use the result (``topo-tune exec``/``env``, ``admin rollout create``, the hostfile);
* per collective, the speedup per message size with each bucket's CI as a band and the 1.0 line, and busbw
  of NCCL's defaults vs the tuned configuration on log–log axes, with the nccl-tests-style table behind them;
* the closest candidate when nothing was promoted, and the trade-off (the best finalist that could not be
  chosen, with its per-bucket decisions and what would accept it) whenever the summary carries one;
* the knobs' effects (Optuna's PED-ANOVA parameter importances, drawn by Optuna's own visualization module);
* the trial history, failed and pruned trials listed with their reasons;
* the node-pair bandwidth heatmap with rack boundaries;
* what jobs measured themselves (``exec --compare``): written empty by the tuning pass, which runs before any
  job, and refreshed in place from the controller by ``topo-tune admin job comparisons --report``.
* what the version's learning jobs showed (``docs/learning.md``): likewise written empty, and refreshed in
  place by ``topo-tune admin learning evidence ID --report``.

Every figure is labelled SIMULATED or measured. Images are inline PNGs (``data:`` URIs): the file needs no
network and no other file. The same inputs give the same bytes (figures carry no date or version).

One module per part: ``figure`` (the PNG record and its encoding), ``figures`` and ``knobs`` (what is drawn),
``markup`` (HTML building blocks), ``summary_box``, ``tables``, ``job_comparisons`` and ``learning_evidence``
(the page's sections), ``page`` (the whole page).

Non-goals: computing statistics (the proof does; this package only combines the per-bucket bounds it is
given), and writing files (``outputs`` does).
"""
