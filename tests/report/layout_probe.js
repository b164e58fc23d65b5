// The layout probe of the headless-browser test (report_html_test.cpp), embedded in the test at build
// time and placed at the end of the page through html_options::body_end. Once the page has loaded it
// counts the rects the browser really drew (a nonzero box) and measures each SVG's width, writes them as
// JSON into <pre id="render-check">, and marks the body rendered. Reports for readers carry no script.
window.addEventListener('load', function () {
  function drawn(id, sel) {
    var svg = document.getElementById(id), n = 0;
    if (!svg) return 0;
    svg.querySelectorAll(sel).forEach(function (r) { if (r.getBBox().width > 0) ++n; });
    return n;
  }
  var widths = [];
  document.querySelectorAll('svg').forEach(function (s) {
    widths.push(Math.round(s.getBoundingClientRect().width));
  });
  document.getElementById('render-check').textContent = JSON.stringify({
    timeline_rects: drawn('timeline', 'rect[data-kind]'),
    bar_rects: drawn('bars', 'rect[data-category]'),
    svg_widths: widths
  });
  document.body.dataset.rendered = 'ok';
});
