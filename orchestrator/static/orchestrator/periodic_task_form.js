// django-celery-beat's periodic task form: under the crontab field, the chosen schedule in
// words (its own template does this in an inline script, which the site's policy blocks).
"use strict";
{
    const $ = django.jQuery;
    const script = document.getElementById("periodic-task-overrides");
    const readable = JSON.parse(document.getElementById("readable-crontabs").textContent);
    const help = script.dataset.crontabHelp;

    $(".field-crontab_translation").hide();
    $(".field-crontab").change(function () {
        const translation = readable[$("#id_crontab").val()];
        $(".field-crontab .help").empty().append(
            document.createTextNode(help),
            document.createElement("br"),
            document.createTextNode(`Translation: ${translation}`),
        );
    });
}
