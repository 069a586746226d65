// The start form: choosing another task reloads the page with that task's input fields
// (`?task=`), which the server generates from the task's input schema.
"use strict";
{
    const select = document.getElementById("id_task");
    if (select) {
        select.addEventListener("change", () => {
            const query = new URLSearchParams(window.location.search);
            query.set("task", select.value);
            window.location.search = query.toString();
        });
    }
}
